"""What the operator sees, on the real flow (small CI config, 3 iterations, evaluated each
iteration, run.keep_checkpoints=1), run and then resumed under the same run id: Prefect flow and
task run names, MLflow tags and links between the two UIs, grouped metric names, checkpoint
retention that a resume replays through, and `trace-rl report` on the run home."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from trace_core.config import load_train_config
from trace_core.policy.model import TINY_WARM_DIR

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("refresh-predictor", "allocate-roots", "generate-raw-rollouts", "score-prefixes", "extend-and-refill",
          "verify-rewards", "update-policy", "record-iteration")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                                   reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


@pytest.fixture(scope="module")
def ran(prefect_server, tmp_path_factory):
    from flows.train import train_flow

    home = tmp_path_factory.mktemp("home")
    cfg = load_train_config(ROOT / "configs" / "small-ci.yaml",
                            ["run.iterations=3", "run.eval_every=1", "run.keep_checkpoints=1", "run.threads=1"])
    first = train_flow(cfg, run_id="ops", home=str(home))
    again = train_flow(cfg, run_id="ops", home=str(home))  # the same command again: a resume that replays
    return home, first, again


def _flow_runs(name: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])),
                                     sort=FlowRunSort.START_TIME_ASC)


def _mlflow_run(home: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    return client, client.get_run((home / "runs" / "ops" / "mlflow_run_id").read_text().strip())


def test_runs_are_named_by_run_id_and_iteration(ran):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs = _flow_runs("ops")
    assert len(runs) == 2  # the run and its resume: one name
    expected = ({f"{s} ops iter {i}" for s in STAGES for i in range(3)} | {"evaluate ops before training"}
                | {f"evaluate ops after iter {i}" for i in range(3)})
    with get_client(sync_client=True) as client:
        for run in runs:
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
            assert {t.name for t in tasks} == expected


def test_mlflow_and_prefect_point_at_each_other(ran):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    home, _, _ = ran
    _, run = _mlflow_run(home)
    latest = _flow_runs("ops")[-1]
    assert run.data.tags["prefect.flow_run_id"] == str(latest.id)  # the flow run that last wrote it
    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert run.data.tags["mlflow.source.git.commit"] == head.stdout.strip()
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["mlflow-ops"])))
    assert arts and any(f"`{run.info.run_id}`" in a.data for a in arts)


def test_metric_names_are_grouped(ran):
    home, _, _ = ran
    client, run = _mlflow_run(home)
    keys = set(run.data.metrics)
    assert {"effective/ratio", "effective/wasted_share", "budget/used", "budget/tokens", "accuracy/all",
            "time/iteration_s", "time/update_s", "time/raw_s", "predictor/train_loss", "update/loss"} <= keys
    # the statistics RL users know from TRL / verl (README, Tracking: the metrics table)
    assert {"reward/mean", "reward/std", "reward/frac_zero_std", "response/mean_length", "response/max_length",
            "response/clipped_ratio", "episode/turns_mean", "episode/tool_calls_mean", "update/entropy",
            "update/clip_frac", "time/raw_tokens_per_s", "time/update_tokens_per_s"} <= keys
    assert all("/" in k for k in keys), sorted(k for k in keys if "/" not in k)
    assert "predictor/root_auc" in keys or not any(k.startswith("predictor/root_") for k in keys)
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "effective/ratio"))
    assert steps == [0, 1, 2]  # step = the store's iteration, once per iteration, across the resume
    for key in ("update/loss", "time/iteration_s", "budget/used"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [0, 1, 2], key
    # accuracy at the step of the `evaluations` view: after `step` iterations (0 = before training)
    acc = sorted(m.step for m in client.get_metric_history(run.info.run_id, "accuracy/all"))
    assert acc == [0, 1, 2, 3]


def test_params_describe_the_model_trained(ran):
    """The model's params are the loaded checkpoint's sizes, not the defaults."""
    import json

    home, _, _ = ran
    _, run = _mlflow_run(home)
    hf = json.loads((TINY_WARM_DIR / "config.json").read_text())
    p = run.data.params
    assert (p["model.hidden_size"], p["model.head_dim"], p["model.intermediate_size"]) == (
        str(hf["hidden_size"]), str(hf["head_dim"]), str(hf["intermediate_size"])) == ("128", "32", "384")
    assert p["model.num_layers"] == str(hf["num_hidden_layers"]) and p["model.path"] == str(TINY_WARM_DIR)


def test_prefect_runs_are_tagged_and_artifacts_rounded(ran):
    """Flow and task runs carry run / strategy / config tags (task runs also
    the iteration); the allocation table artifact shows rounded numbers."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
    )

    from trace_core.config.io import config_hash

    home, first, _ = ran
    cfg = load_train_config(ROOT / "configs" / "small-ci.yaml",
                            ["run.iterations=3", "run.eval_every=1", "run.keep_checkpoints=1", "run.threads=1"])
    want = {"run:ops", f"strategy:{cfg.allocation.strategy}", f"config:{config_hash(cfg)}"}
    runs = _flow_runs("ops")
    with get_client(sync_client=True) as client:
        for run in runs:
            assert want <= set(run.tags), run.tags
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
            for t in tasks:
                assert want <= set(t.tags), (t.name, t.tags)
                m = re.search(r" iter (\d+)$", t.name)
                if m:
                    assert f"iteration:{m[1]}" in t.tags, (t.name, t.tags)
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["allocation-ops"])))
    assert arts and all(not re.search(r"\d\.\d{5,}", str(a.data)) for a in arts), arts[0].data


def test_retention_keeps_newest_and_best_and_the_resume_replays(ran):
    home, first, again = ran
    ckpts = home / "runs" / "ops" / "checkpoints"
    acc = {r["iteration"]: r["accuracy"] for r in first["iterations"]}
    best = max((a, i) for i, a in acc.items())[1]
    for i in range(3):
        kept = (ckpts / f"iter={i:05d}" / "model.safetensors").is_file()
        retired = (ckpts / f"iter={i:05d}" / "RETIRED.json").is_file()
        assert (kept, retired) == ((True, False) if i in {2, best} else (False, True)), (i, acc)
    assert again["recomputed"] == []  # retired checkpoints are not "lost": nothing recomputed
    assert [r["effective_ratio"] for r in again["iterations"]] == [r["effective_ratio"] for r in first["iterations"]]


def test_report_command_on_the_run_home(ran, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    home, _, _ = ran
    out = tmp_path / "ops.html"
    res = CliRunner().invoke(app, ["report", "ops", "--home", str(home), "--out", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*(?!["']?(?:data:|#))|url\(|@import|<script|<link""", page, re.I)
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 7
    assert "<b>3</b><span>iterations</span>" in page and "Predictor calibration" in page
    bad = CliRunner().invoke(app, ["report", "nope", "--home", str(home), "--out", str(tmp_path / "x.html")])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
    assert "unknown run id 'nope'" in bad.output and "ops" in bad.output and not (tmp_path / "x.html").exists()


def test_flow_run_url_tag_with_a_configured_server(prefect_server, monkeypatch):
    from prefect import flow
    from prefect.settings import PREFECT_UI_URL, temporary_settings

    from tasks.artifacts import prefect_link_tags

    @flow
    def probe() -> dict:
        return prefect_link_tags()

    for name in ("PREFECT_API_URL", "PREFECT_UI_URL"):
        monkeypatch.delenv(name, raising=False)
    assert "prefect.flow_run_url" not in probe()  # no server configured by the operator: id only
    monkeypatch.setenv("PREFECT_UI_URL", "http://prefect.example:4200")
    with temporary_settings({PREFECT_UI_URL: "http://prefect.example:4200"}):
        tags = probe()
    assert tags["prefect.flow_run_url"] == f"http://prefect.example:4200/runs/flow-run/{tags['prefect.flow_run_id']}"
