"""The self-contained HTML report on the hand-checked store fixture (the real flow's home is
tested in tests/flows/test_operator_view.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_fixture import build_fixture_store  # noqa: E402

from trace_core.home.queries import run_named_query  # noqa: E402
from tracking.html_report import UnknownRun, html_table, render_html_report  # noqa: E402

EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*(?!["']?(?:data:|#))|url\(|@import|<script|<link""", re.I)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return build_fixture_store(tmp_path_factory.mktemp("store"))


def test_report_is_self_contained(home):
    page = render_html_report(home, "r1")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    for title in ("Effective ratio per iteration", "Waste by branching depth", "Waste by task", "Waste by difficulty",
                  "Root allocation", "Predictor calibration", "Top wasted prompts"):
        assert f"<h2>{title}</h2>" in page
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{200,}"', page)) == 7
    by_it = run_named_query(home, "wasted_by_iteration", run_id="r1")  # the headline is the named query's
    assert f"<b>{by_it['trajectories'].sum()}</b><span>trajectories</span>" in page
    assert f"<b>{by_it['wasted'].sum()}</b><span>wasted trajectories</span>" in page
    assert "trace-rl sql wasted_by_depth --run-id r1" in page


def test_unknown_run_is_refused_with_the_known_ones(home):
    with pytest.raises(UnknownRun, match=r"unknown run id 'nope' in .*: runs with recorded iterations: r1"):
        render_html_report(home, "nope")


def test_cells_are_escaped():
    cell = html_table(pl.DataFrame({"prompt_id": ['<img src=x onerror="alert(1)">'], "n": [1]}))
    assert "<img" not in cell and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in cell
