"""Datasets from local files: mixing, held-out split, bad rows, QA corpus, pools and the CLI check.
Data: the project-written sample files (trace_core/data/samples), copied or edited in tmp dirs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from trace_core.config import TrainConfig, load_train_config
from trace_core.config.io import ConfigError
from trace_core.envs import replay
from trace_core.envs.config import EnvConfig
from trace_core.envs.datasets import DataError, data_envs, load_data, loaded
from trace_core.envs.datasets_config import DataConfig
from trace_core.envs.synthetic import demonstration
from trace_core.runtime import check_names
from trace_core.stages.prompt_pools import candidate_pool, heldout_pool, training_set

SAMPLES = Path(__file__).resolve().parents[2] / "trace_core" / "data" / "samples"
ROOT = Path(__file__).resolve().parents[2]


def _gsm8k_file(path: Path, n: int, tag: str) -> Path:
    rows = [json.loads(x) for x in (SAMPLES / "gsm8k_64.jsonl").read_text().splitlines()]
    with path.open("w") as f:
        for i in range(n):
            r = rows[i % len(rows)]
            f.write(json.dumps({**r, "id": f"{tag}{i}", "question": f"{r['question']} ({tag} {i})"}) + "\n")
    return path


def _data(**kw) -> DataConfig:
    return DataConfig.model_validate(kw)


def test_mixing_weights_set_each_files_share_of_the_candidates(tmp_path):
    a, b = _gsm8k_file(tmp_path / "a.jsonl", 300, "a"), _gsm8k_file(tmp_path / "b.jsonl", 100, "b")
    cfg = TrainConfig.model_validate({"run": {"candidate_pool": 40, "eval_tasks": 0}, "data": {"train": [
        {"path": str(a), "loader": "gsm8k", "weight": 1.0}, {"path": str(b), "loader": "gsm8k", "weight": 3.0}]}})
    assert len(training_set(cfg)) == 400
    share_b = [np.mean([t.prompt_id.startswith("b:") for t in candidate_pool(cfg, i)]) for i in range(30)]
    assert 0.68 < float(np.mean(share_b)) < 0.82  # weight 3 of 4, although b holds a quarter of the rows
    pool = candidate_pool(cfg, 5)
    assert len(pool) == 40 and len({t.prompt_id for t in pool}) == 40  # without replacement
    assert [t.prompt_id for t in pool] == [t.prompt_id for t in candidate_pool(cfg.model_copy(deep=True), 5)]
    assert {t.prompt_id for t in pool} != {t.prompt_id for t in candidate_pool(cfg, 6)}


def test_heldout_share_is_a_fixed_split_and_heldout_files_are_removed_from_training(tmp_path):
    d = load_data(_data(train=[{"path": str(SAMPLES / "gsm8k_64.jsonl"), "loader": "gsm8k"}], heldout_share=0.25))
    train, held = {t.prompt_id for t in d.train_tasks}, {t.prompt_id for t in d.heldout}
    assert len(train) + len(held) == 64 and not train & held and 8 <= len(held) <= 24
    again = load_data(_data(train=[{"path": str(SAMPLES / "gsm8k_64.jsonl"), "loader": "gsm8k"}], heldout_share=0.25))
    assert {t.prompt_id for t in again.heldout} == held  # a hash of the id: the same split every time
    # the same rows named as held-out: their questions leave the training set
    sub = tmp_path / "test.jsonl"
    sub.write_text("".join((SAMPLES / "gsm8k_64.jsonl").read_text().splitlines(keepends=True)[:10]))
    d2 = load_data(_data(train=[{"path": str(SAMPLES / "gsm8k_64.jsonl"), "loader": "gsm8k"}],
                         heldout=[{"path": str(sub), "loader": "gsm8k", "name": "test"}]))
    assert len(d2.heldout) == 10 and len(d2.train_tasks) == 54
    assert not {t.question for t in d2.heldout} & {t.question for t in d2.train_tasks}


def test_bad_rows_are_reported_with_file_and_line(tmp_path):
    good = (SAMPLES / "gsm8k.jsonl").read_text().splitlines()
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join([good[0], "{not json", json.dumps({"question": "no answer"}), good[1],
                            json.dumps({"question": "  ", "answer": "#### 3"}), json.dumps([1, 2]),
                            json.dumps({"question": "q", "answer": "no final marker"}), good[2]]) + "\n")
    lines = []
    d = load_data(_data(train=[{"path": str(f), "loader": "gsm8k"}], heldout_share=0.3), progress=lines.append)
    assert len(d.train_tasks) + len(d.heldout) == 3
    assert [p.split(": bad gsm8k row: ")[0] for p in d.problems] == [f"{f}:{n}" for n in (2, 3, 5, 6, 7)]
    assert "missing field 'answer'" in d.problems[1] and "empty or non-scalar question" in d.problems[2]
    assert "final answer" in d.problems[4]
    assert any("3 tasks, 5 skipped" in line for line in lines) and any(f"{f}:2" in line for line in lines)
    with pytest.raises(DataError, match=rf"{f}:2: bad gsm8k row: not JSON"):
        load_data(_data(train=[{"path": str(f), "loader": "gsm8k"}], heldout_share=0.3, on_bad_row="error"))


def test_missing_file_empty_set_and_config_errors(tmp_path):
    with pytest.raises(DataError, match=r"data.train\[0\].path: .*nope.jsonl not found"):
        load_data(_data(train=[{"path": str(tmp_path / "nope.jsonl"), "loader": "gsm8k"}]))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(DataError, match=r"data.train: no usable tasks in 1 file\(s\) \(1 bad rows\)"):
        load_data(_data(train=[{"path": str(empty), "loader": "gsm8k"}]))
    with pytest.raises(DataError, match=r"data.heldout: no usable held-out tasks \(1 bad rows\)"):
        load_data(_data(train=[{"path": str(SAMPLES / "gsm8k.jsonl"), "loader": "gsm8k"}],
                        heldout=[{"path": str(empty), "loader": "gsm8k"}]))
    with pytest.raises(ConfigError, match=r"data.train\[0\].loader: unknown loader 'squad'; known: bfcl, gsm8k"):
        check_names(TrainConfig.model_validate({"data": _data(train=[{"path": "x", "loader": "squad"}]).model_dump(),
                                                "run": {"eval_tasks": 0}}))
    with pytest.raises(ConfigError, match="no held-out split"):
        load_train_config(None, ["data.train=[{path: x.jsonl, loader: gsm8k}]"])
    load_train_config(None, ["data.train=[{path: x.jsonl, loader: gsm8k}]", "run.eval_tasks=0"])  # validates
    twin = tmp_path / "sub" / "gsm8k.jsonl"
    twin.parent.mkdir()
    twin.write_text((SAMPLES / "gsm8k.jsonl").read_text())
    with pytest.raises(DataError, match=r"data.heldout\[0\].name: 'gsm8k' is also data.train\[0\]'s name"):
        load_data(_data(train=[{"path": str(SAMPLES / "gsm8k.jsonl"), "loader": "gsm8k"}],
                        heldout=[{"path": str(twin), "loader": "gsm8k"}]))


def test_cli_refuses_a_run_without_data_in_one_line(tmp_path):
    runner = CliRunner()
    home = tmp_path / "home"
    res = runner.invoke(app, ["train", "--home", str(home), "--set", "run.eval_tasks=0",
                              "--set", f"data.train=[{{path: {tmp_path}/missing.jsonl, loader: gsm8k}}]"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.strip().splitlines() == [f"data.train[0].path: {tmp_path}/missing.jsonl not found"]
    assert not home.exists()  # nothing created


def test_qa_rows_share_one_search_corpus_and_their_demos_still_solve(tmp_path):
    data = _data(train=[{"path": str(SAMPLES / "hotpotqa.json"), "loader": "hotpotqa"},
                        {"path": str(SAMPLES / "musique.jsonl"), "loader": "musique"}],
                 heldout=[{"path": str(SAMPLES / "gsm8k.jsonl"), "loader": "gsm8k"}])
    d = loaded(data)
    per_task = sum(len(t.payload["paragraphs"]) for t in d.train_tasks)
    assert 0 < len(d.corpus) <= per_task and len(set(d.corpus)) == len(d.corpus)
    envs = data_envs(EnvConfig(), data)
    assert set(envs) == {"math", "qa"}  # the families the files hold
    hot, mus = d.train_tasks[0], d.train_tasks[-1]
    ep = envs["qa"].reset(hot)
    obs = ep.step('<tool_call>{"name": "search", "arguments": {"query": "Brann Hill"}}</tool_call>').observation
    assert "Brann Hill" in obs  # a MuSiQue paragraph, found from a HotpotQA question: one corpus
    for t in (hot, mus):
        assert replay(envs["qa"], t, demonstration(t))[1][-1].reward == 1.0
    task_only = data_envs(EnvConfig(), data.model_copy(update={"corpus": "task"}))
    obs = task_only["qa"].reset(hot).step(
        '<tool_call>{"name": "search", "arguments": {"query": "Brann Hill"}}</tool_call>').observation
    assert "Brann Hill" not in obs


def test_gsm8k_tiny_config_pools_come_from_the_sample_file():
    cfg = load_train_config(ROOT / "configs" / "gsm8k-tiny.yaml")
    train, held = training_set(cfg), heldout_pool(cfg)
    assert all(t.prompt_id.startswith("gsm8k_64:") and t.family == "math" for t in (*train, *held))
    assert len(train) + len(held) >= 60 - 0 and len(held) == cfg.run.eval_tasks
    assert not {t.prompt_id for t in train} & {t.prompt_id for t in held}
    cands = candidate_pool(cfg, 0)
    assert len(cands) == cfg.run.candidate_pool and {t.prompt_id for t in cands} <= {t.prompt_id for t in train}
    from trace_core.envs.datasets import build_environments

    envs = build_environments(cfg.env, cfg.data)
    assert set(envs) == {"math"}
    math_env = envs["math"]
    assert all(replay(math_env, t, demonstration(t))[1][-1].reward == 1.0 for t in train[:10])


@pytest.mark.slow
def test_one_iteration_of_the_gsm8k_config_trains_on_dataset_prompts(tmp_path):
    """Stages 1-7 of iteration 0 on the GSM8K-format sample with the shipped tiny policy (a small
    budget: the whole `trace-rl train --config configs/gsm8k-tiny.yaml` takes minutes here)."""
    import polars as pl

    from tests.iteration_stages import run_until_verified
    from trace_core.home.shards import read_shard
    from trace_core.runtime import Runtime
    from trace_core.stages import iteration as it
    from trace_core.stages.run import RunRef, initial_checkpoint

    cfg = load_train_config(ROOT / "configs" / "gsm8k-tiny.yaml", [
        "run.candidate_pool=8", "run.eval_tasks=4", "run.eval_samples=1", "allocation.budget_total=16",
        "allocation.group_size=4", "allocation.trace.max_per_prompt=4", "sampling.max_new_tokens=32", "env.max_turns=3"])
    ref, ckpt = RunRef(str(tmp_path / "home"), "gsm8k"), initial_checkpoint(cfg)
    rt = Runtime(cfg)
    before = it.evaluate(cfg, ckpt, rt)
    assert [c[:2] for c in before.cells] == [("math", 0)] and sum(c[3] for c in before.cells) == 4
    out = run_until_verified(ref, cfg, ckpt, before, rt)
    nodes = read_shard(out["verified"].nodes)
    train_ids = {t.prompt_id for t in training_set(cfg)}
    assert set(nodes["prompt_id"].unique()) <= train_ids and nodes.filter(pl.col("is_leaf")).height > 0
    update = it.update_policy(ref, cfg, 0, ckpt, out["verified"], rt)
    assert Path(update.checkpoint, "config.json").is_file()
