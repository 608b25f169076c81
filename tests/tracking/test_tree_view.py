"""The report's rollout trees rendered by headless Chromium: on the hand-checked
store fixture (tests/store/store_fixture.py) the page renders, and the trees drawn have the
expected nodes and branch points, in the expected order."""

from __future__ import annotations

import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_fixture import build_fixture_store  # noqa: E402

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")
runner = CliRunner()
pytestmark = pytest.mark.slow  # a real headless Chromium per page (~20 s cold, ~5 s warm, at load ~5)


def _browser() -> str:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    pytest.skip("no headless Chromium (.ci/run installs Debian's chromium-headless-shell)")


def rendered_dom(page: Path, tmp_path: Path) -> str:
    """The DOM headless Chromium built from ``page``, offline (every host unresolvable)."""
    out = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


class Trees(HTMLParser):
    """Per ``div.tree``: (iteration, prompt, node count, branch-point count, flipped leaves)."""

    def __init__(self):
        super().__init__()
        self.trees: list[list] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "div" and "tree" in cls:
            self.trees.append([int(a["data-iteration"]), a["data-prompt"], 0, 0, 0])
        elif tag == "li" and "node" in cls and self.trees:
            self.trees[-1][2] += 1
            self.trees[-1][3] += "branch" in cls
        elif tag == "span" and "flip" in cls and self.trees:
            self.trees[-1][4] += 1


def _trees(dom: str) -> list[tuple]:
    parser = Trees()
    parser.feed(dom)
    return [tuple(t) for t in parser.trees]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return build_fixture_store(tmp_path_factory.mktemp("store"))


def test_report_trees_render_in_chromium(home, tmp_path):
    page = tmp_path / "r1.html"
    res = runner.invoke(app, ["report", "r1", "--home", str(home), "--out", str(page)])
    assert res.exit_code == 0, res.output
    dom = rendered_dom(page, tmp_path)
    assert "trace-rl report: r1" in dom and "Rollout trees" in dom
    # the three most wasteful trees: B (iteration 0, 2 wasted), A (iteration 1, 2 wasted), then D
    # (iteration 1: 1 wasted, 1 branch group, 4 trajectories): root, d1 (2 turns), d2 (2 turns),
    # continuations f1 and f2 from d1's first turn (the one branch point); f1 flipped d1's reward
    assert _trees(dom) == [(0, "B", 3, 0, 0), (1, "A", 3, 0, 0), (1, "D", 7, 1, 1)]
    assert "p(flip)" in dom and "flipped 1/2" in dom


def test_a_chosen_prompts_trees(home, tmp_path):
    page = tmp_path / "a.html"
    res = runner.invoke(app, ["report", "r1", "--home", str(home), "--out", str(page), "--prompt", "A"])
    assert res.exit_code == 0, res.output
    # most wasted first: iteration 1 (a3, a4: 2 wasted), then iteration 0 (1 wasted): a1, a2 (2 turns
    # each) and e1 from a1's first turn (reward 1, as a1's: no flip)
    assert _trees(rendered_dom(page, tmp_path)) == [(1, "A", 3, 0, 0), (0, "A", 6, 1, 0)]
