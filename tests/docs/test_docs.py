"""The docs stay true: the generated pages match what scripts/gen_docs.py writes now, every
`trace-rl` command, flag and `--set` key that README and the docs pages name exists, and the
tutorials' marked shell blocks run (slow)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from tests.flows.conftest import prefect_server  # noqa: F401  (the fixture: one temporary server)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: a shell block the slow test runs: this marker on the line before its ```bash fence
MARK = "<!-- docs-test -->"


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _gen_docs()


def test_generated_pages_are_up_to_date():
    assert GEN.unlisted_results() == [], "a CSV under docs/results is on no page: add it to RESULT_SECTIONS"
    assert GEN.stale_pages() == [], "run: python scripts/gen_docs.py"


def _prose_pages() -> list[Path]:
    """README and the hand-written docs pages (the experiments log records past runs as they were
    run, and the generated pages are checked above)."""
    generated = {DOCS / rel for rel in GEN.PAGES}
    return [ROOT / "README.md", *(p for p in sorted(DOCS.rglob("*.md"))
                                  if p not in generated and p.name != "experiments.md" and "results" not in p.parts)]


def _code(text: str) -> str:
    """The code of a markdown page: its fenced blocks and its inline code spans, one per line."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return "\n".join([*fenced, *re.findall(r"`([^`\n]+)`", rest)])


def _commands(text: str) -> list[tuple[str, str]]:
    """(command, the rest of its line up to a comment or a table cell's end) for every
    `trace-rl COMMAND` in the code of a page; shell continuations are joined first."""
    code = re.sub(r"\\\n\s*", " ", _code(text))
    return [(m.group(1), m.group(2))
            for m in re.finditer(r"(?<![\w/.-])trace-rl ([a-z][a-z0-9-]*)([^\n#|;]*)", code)]


#: `--set` keys the pages name on purpose although no config has them (placeholders, the example
#: of an invalid config)
NOT_KEYS = {"key", "run.bogus"}


def _config_key_exists(key: str) -> bool:
    from pydantic import BaseModel

    from trace_core.config import TrainConfig

    model = TrainConfig
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return False
        model = model.model_fields[part].annotation
        args = [a for a in typing.get_args(model) if a is not type(None)]
        if len(args) == 1:  # an optional section (X | None): its keys are X's
            model = args[0]
    return True


def test_every_documented_command_flag_and_key_exists():
    commands = GEN.cli_commands()
    seen, bad = 0, []
    for page in _prose_pages():
        for name, rest in _commands(page.read_text()):
            where = f"{page.relative_to(ROOT)}: trace-rl {name}{rest.rstrip()}"
            if name not in commands:
                bad.append(f"{where}: no command {name!r}")
                continue
            seen += 1
            options = {o for p in commands[name].params for o in [*p.opts, *p.secondary_opts]} | {"--help"}
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                if flag not in options:
                    bad.append(f"{where}: {name} has no option {flag}")
            for key in re.findall(r"--set[ =]([a-z_][a-z0-9_.]*)=", rest):
                if key not in NOT_KEYS and not _config_key_exists(key):
                    bad.append(f"{where}: no config key {key!r}")
    assert seen > 20, "the pages name fewer commands than expected: is the pattern still right?"
    assert bad == []


def test_the_commands_found_are_the_ones_written():
    """The extraction the check above relies on, on a known text."""
    text = ("trace-rl trains models: run `trace-rl sql wasted_by_iteration --run-id RUN` then\n\n"
            "```bash\ntrace-rl train --set run.seed=3 \\\n  --home H  # x\ncd /opt/trace-rl run\n```\n")
    assert _commands(text) == [("train", " --set run.seed=3  --home H  "), ("sql", " wasted_by_iteration --run-id RUN")]
    assert _config_key_exists("allocation.budget_total") and not _config_key_exists("allocation.nosuch")
    assert _config_key_exists("allocation.trace.min_active") and not _config_key_exists("allocation.trace.nosuch")


def _tutorial_blocks() -> list[tuple[str, str]]:
    """(page, shell text) of every marked block of the tutorials, in the order of the site's nav."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    tutorials = next(section["Tutorials"] for section in nav if "Tutorials" in section)
    blocks = []
    for entry in tutorials:
        (rel,) = entry.values()
        text = (DOCS / rel).read_text()
        for m in re.finditer(re.escape(MARK) + r"\n```(?:bash|sh)\n(.*?)\n```", text, re.S):
            blocks.append((rel, m.group(1)))
    return blocks


def test_tutorials_have_runnable_blocks():
    pages = {page for page, _ in _tutorial_blocks()}
    assert {"tutorials/main-job.md", "tutorials/compare.md", "tutorials/querying.md"} <= pages


@pytest.mark.slow
def test_tutorial_commands_run(tmp_path, prefect_server):  # noqa: F811
    """Every marked block, verbatim, in one scratch directory (a later tutorial queries the run an
    earlier one made), against the session's temporary Prefect server: ~2 min on 2 cores."""
    from prefect.settings import PREFECT_API_URL

    (tmp_path / "configs").symlink_to(ROOT / "configs")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "trace-rl"  # this checkout's CLI under the name the docs use
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m flows.cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "HF_HUB_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=PREFECT_API_URL.value(),
               MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", MPLBACKEND="Agg")
    for page, block in _tutorial_blocks():
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{page}:\n{block}\n--- stderr:\n{proc.stderr[-3000:]}"
    assert (tmp_path / "report.html").is_file() and (tmp_path / "comparison.html").is_file()
