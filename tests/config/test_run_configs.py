"""The shipped run configs validate, every field they set is read by the code, and the Qwen3
configs have the paper's budget shape with settings that fit together."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trace_core.config import load_train_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
QWEN = ["qwen3-8b.yaml", "qwen3-14b.yaml"]


def _leaves(node, path=()):
    """(dotted path, key) of every value a YAML file sets (list items of dicts: their keys)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*path, str(k)))
    elif isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
        for i, item in enumerate(node):
            yield from _leaves(item, (*path, str(i)))
    else:
        yield ".".join(path), path[-1]


def _code() -> str:
    files = [p for d in ("trace_core", "flows", "tasks", "tracking") for p in (ROOT / d).rglob("*.py")]
    return "\n".join(p.read_text() for p in files)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates_and_every_field_it_sets_is_read(name):
    load_train_config(ROOT / "configs" / name)
    raw = yaml.safe_load((ROOT / "configs" / name).read_text())
    code = _code()
    unread = [path for path, key in _leaves(raw) if not re.search(rf"\.{re.escape(key)}\b", code)]
    assert not unread, f"{name} sets fields no code reads: {unread}"


@pytest.mark.parametrize("name", QWEN)
def test_qwen3_configs_budget_shape_and_settings_fit(name):
    cfg = load_train_config(ROOT / "configs" / name)
    assert cfg.allocation.budget_total == 2048  # the paper's trajectories per iteration
    assert cfg.run.candidate_pool >= cfg.allocation.budget_total // cfg.allocation.group_size
    assert cfg.run.engine == "vllm" and cfg.model.dtype == "bfloat16" and cfg.model.path
    assert cfg.model.chat_template == "tokenizer" and cfg.model.enable_thinking is not None
    assert cfg.env.prompt_style == "full"  # Qwen3's JSON tool schemas, not the tiny one-liner
    assert cfg.sampling.top_k == 0 and cfg.sampling.top_p == 1.0  # what the vllm engine accepts
    assert cfg.sampling.max_new_tokens + cfg.env.max_tokens_per_episode <= cfg.vllm.max_model_len
    assert cfg.vllm.max_model_len <= cfg.model.max_position_embeddings
    assert cfg.update.gradient_checkpointing and cfg.update.logprob_chunk > 0
    assert cfg.update.minibatch_size <= cfg.allocation.budget_total
    assert cfg.data.enabled and cfg.data.heldout and cfg.tracking.registered_model_name
    # nothing can be downloaded: every path is local
    assert all(p.startswith("/") for p in [cfg.model.path, *(f.path for f in cfg.data.train + cfg.data.heldout)])


def test_qwen3_14b_shards_the_engine_over_more_gpus_than_8b():
    q8, q14 = (load_train_config(ROOT / "configs" / n) for n in QWEN)
    assert q14.vllm.tensor_parallel_size > q8.vllm.tensor_parallel_size
    assert q14.update.micro_batch_size <= q8.update.micro_batch_size


def _values(node, path=()):
    """{dotted path: value} of every value a YAML file sets (as ``_leaves`` walks it)."""
    if isinstance(node, dict):
        return {k: v for key, child in node.items() for k, v in _values(child, (*path, str(key))).items()}
    if isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
        return {k: v for i, child in enumerate(node) for k, v in _values(child, (*path, str(i))).items()}
    return {".".join(path): node}


def test_the_rehearsal_config_is_qwen3_8b_but_for_what_the_machine_forces():
    """configs/qwen3-rehearsal.yaml (scripts/rehearsal.py) runs qwen3-8b.yaml's path on CPU: every
    value it does not share with qwen3-8b.yaml is one a CPU machine forces, marked `# machine`."""
    q8 = _values(yaml.safe_load((ROOT / "configs" / "qwen3-8b.yaml").read_text()))
    text = (ROOT / "configs" / "qwen3-rehearsal.yaml").read_text()
    values = _values(yaml.safe_load(text))
    assert set(q8) <= set(values), f"qwen3-8b.yaml keys the rehearsal drops: {set(q8) - set(values)}"
    changed = {p for p in values if p not in q8 or values[p] != q8[p]}
    forced = {"run.iterations", "run.candidate_pool", "run.eval_tasks", "run.eval_samples", "run.device",
              "model.path", "model.dtype", "sampling.max_new_tokens", "allocation.budget_total",
              "allocation.group_size", "allocation.trace.max_per_prompt", "update.skip_zero_advantage",
              "update.world_size", "vllm.enforce_eager"}
    assert {p for p in changed if not p.startswith("data.")} <= forced
    for key in {p.split(".")[-1] for p in changed if not p.startswith("data.")}:
        line = next(li for li in text.splitlines() if li.strip().startswith(f"{key}:"))
        assert "# machine" in line, line
    cfg = load_train_config(ROOT / "configs" / "qwen3-rehearsal.yaml")
    assert (cfg.model.chat_template, cfg.env.prompt_style, cfg.run.engine) == ("tokenizer", "full", "vllm")
    assert (cfg.update.strategy, cfg.update.gradient_checkpointing, cfg.update.logprob_chunk) == ("fsdp", True, 1024)
    assert cfg.tracking.registered_model_name == "qwen3-8b-trace" and cfg.data.enabled


@pytest.mark.parametrize("name", [*QWEN, "qwen3-rehearsal.yaml"])
def test_a_registered_model_has_time_to_upload_before_the_run_ends(name):
    """The registered model is the whole checkpoint, uploaded to the tracking server when the run
    finishes; the tracker waits tracking.finish_timeout_s (default 30 s) and then leaves what is unsent
    for a later session. The rehearsal's 96 MB toy already missed 30 s on a loaded CPU (the MLflow run
    stayed RUNNING, no model version); Qwen3-8B's weights are 16 GB."""
    cfg = load_train_config(ROOT / "configs" / name)
    assert cfg.tracking.registered_model_name and cfg.tracking.finish_timeout_s >= 1800
