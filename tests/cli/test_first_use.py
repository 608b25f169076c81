"""The command line as a new user meets it: a missing model fails before anything
starts, `warmup` never writes into the package by default, help texts are whole, `--version`."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from trace_core.policy.model import TINY_WARM_DIR

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_missing_model_fails_in_one_line_before_anything_starts(tmp_path):
    """`configs/qwen3-8b.yaml` without its model directory: one line, exit 2, no home."""
    home = tmp_path / "home"
    res = runner.invoke(app, ["train", "--config", str(ROOT / "configs" / "qwen3-8b.yaml"), "--home", str(home),
                              "--set", f"model.path={tmp_path / 'no-such-model'}"])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in res.output, err
    assert "model.path" in err and "no-such-model" in err and "warmup" not in err, err
    assert not home.exists()


def test_warmup_without_out_leaves_the_shipped_checkpoint_alone(tmp_path, monkeypatch):
    """The default output is ./tiny-warm, not the checkpoint inside the package."""
    import trace_core.policy.warmup as warmup

    seen = []
    monkeypatch.setattr(warmup, "warm_start", lambda config, out, **kw: seen.append(Path(out)) or {})
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["warmup"])
    assert res.exit_code == 0, res.output
    assert len(seen) == 1 and seen[0].resolve() == tmp_path / "tiny-warm"
    assert seen[0].resolve() != TINY_WARM_DIR.resolve()


def test_help_is_whole_and_there_is_a_version():
    """`compare`'s --strategies default is spelled out, --tracking-uri is described,
    `trace-rl --version` answers."""
    res = runner.invoke(app, ["compare", "--help"], env={"COLUMNS": "100"}, terminal_width=100)
    assert res.exit_code == 0
    text = " ".join(res.output.replace("│", " ").split())
    assert "trace-prefix" in text and "trace-root" in text, text
    assert "MLflow tracking URI" in text
    for cmd in ("train", "compare"):
        out = runner.invoke(app, [cmd, "--help"], terminal_width=100).output
        assert "MLflow tracking URI" in " ".join(out.replace("│", " ").split())
    ver = runner.invoke(app, ["--version"])
    assert ver.exit_code == 0 and ver.output.startswith("trace-rl ")
