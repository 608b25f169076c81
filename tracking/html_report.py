"""``trace-rl report RUN``: one self-contained HTML page about a run, from the node store.

Every number comes from a named query in ``sql/`` (the same ones ``trace-rl sql`` runs); plots
are matplotlib PNGs embedded as base64 ``data:`` URIs and the style sheet is inline, so the page
opens offline, from a mail attachment or an MLflow artifact, and loads nothing from anywhere.
Text from the store (prompt ids, task names) is data: every cell is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from trace_core.analysis.learning import curve_frame, learning_markdown, learning_table
from trace_core.analysis.outfile import write_output
from trace_core.home.queries import run_named_query
from trace_core.store import query, sql_dir
from tracking.plots import (
    plot_accuracy,
    plot_allocation_histogram,
    plot_calibration,
    plot_effective_ratio,
    plot_waste,
)
from tracking.plots_compare import plot_effective_by_iteration, plot_learning_curves
from tracking.tree_view import TREE_CSS, render_trees, tree_nodes

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
header { background: #24292f; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 0; color: #c9d1d9; }
main { max-width: 1180px; margin: 0 auto; padding: 16px 32px 48px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 8px 0 4px; }
.card { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 16px; min-width: 150px; }
.card b { display: block; font-size: 20px; }
.card span { color: #57606a; font-size: 12px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; margin: 18px 0; padding: 4px 20px 16px; }
section h2 { font-size: 17px; border-bottom: 1px solid #d8dee4; padding-bottom: 6px; }
.row { display: flex; flex-wrap: wrap; gap: 20px; align-items: flex-start; }
.row img { max-width: 560px; width: 100%; border: 1px solid #eaeef2; }
.tbl { overflow-x: auto; max-height: 420px; overflow-y: auto; flex: 1 1 380px; }
table { border-collapse: collapse; font-size: 12.5px; }
th, td { border-bottom: 1px solid #eaeef2; padding: 3px 9px; text-align: right; white-space: nowrap; }
th { background: #f6f8fa; position: sticky; top: 0; }
td.s, th.s { text-align: left; }
code { background: #eff1f3; padding: 1px 5px; border-radius: 4px; font-size: 12px; }
.none { color: #57606a; font-style: italic; }
.whole .tbl { flex: 1 1 100%; max-height: none; }
.whole table { width: 100%; }
"""


class UnknownRun(LookupError):
    """The run id has no recorded iteration and no run directory in the home."""


def _png(draw: Callable[[io.BytesIO], object]) -> str:
    buf = io.BytesIO()
    draw(buf)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def html_table(frame: pl.DataFrame, max_rows: int = 60, drop: tuple[str, ...] = ("run_id",)) -> str:
    """An HTML table of ``frame`` (first ``max_rows`` rows), every cell escaped."""
    frame = frame.drop([c for c in drop if c in frame.columns])
    if not frame.height:
        return '<p class="none">no rows</p>'
    text_cols = {c for c, t in frame.schema.items() if t == pl.Utf8}
    head = "".join(f'<th class="{"s" if c in text_cols else ""}">{html.escape(c)}</th>' for c in frame.columns)
    rows = []
    for row in frame.head(max_rows).iter_rows():
        cells = []
        for c, v in zip(frame.columns, row, strict=True):
            text = "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
            cells.append(f'<td class="{"s" if c in text_cols else ""}">{html.escape(text)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="none">{frame.height - max_rows} more rows</p>' if frame.height > max_rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"


def _section(title: str, query_names: list[str], run_id: str, images: list[str], tables: list[str], note: str = "",
             whole: bool = False) -> str:
    cmds = " ".join(f"<code>trace-rl sql {q} --run-id {html.escape(run_id)}</code>" for q in query_names)
    imgs = "".join(f'<img alt="{html.escape(title)}" src="{src}">' for src in images)
    tbls = "".join(f'<div class="tbl">{t}</div>' for t in tables)
    cls = ' class="whole"' if whole else ""  # whole: tables get the page's width, nothing clipped
    return (f"<section{cls}><h2>{html.escape(title)}</h2><p>{note} {cmds}</p>"
            f'<div class="row">{imgs}{tbls}</div></section>')


def _cards(by_it: pl.DataFrame, iterations: pl.DataFrame) -> str:
    if not by_it.height:
        return '<p class="none">No trajectories recorded yet.</p>'
    total, wasted = int(by_it["trajectories"].sum()), int(by_it["wasted"].sum())
    acc = iterations.filter(pl.col("accuracy").is_not_null()) if iterations.height else iterations
    cards = [("iterations", str(by_it.height)), ("trajectories", f"{total:,}"),
             ("effective ratio (all)", f"{(total - wasted) / total:.1%}" if total else "-"),
             ("effective ratio, first → last", f"{by_it['effective_ratio'][0]:.1%} → {by_it['effective_ratio'][-1]:.1%}"),
             ("wasted trajectories", f"{wasted:,}"), ("tokens", f"{int(by_it['tokens'].sum()):,}")]
    if acc.height:
        cards.append(("held-out accuracy (last)", f"{acc['accuracy'][-1]:.1%}"))
    return '<div class="cards">' + "".join(
        f"<div class=card><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>" for k, v in cards) + "</div>"


def check_run(home: Path, run_id: str, iterations: pl.DataFrame) -> None:
    """``UnknownRun`` (one line, naming the runs the home holds) unless ``run_id`` is known: it has
    recorded iterations, or a runs row (a run still in its first iteration)."""
    if iterations.height or (home / "shards" / "runs" / f"run_id={run_id}").is_dir():
        return
    known = sorted(run_named_query(home, "iteration_summary")["run_id"].unique().to_list())
    shown = ", ".join(known[:20]) + (f" (+{len(known) - 20} more)" if len(known) > 20 else "")
    raise UnknownRun(f"unknown run id {run_id!r} in {home}: " + (f"runs with recorded iterations: {shown}"
                                                                  if known else "no run has recorded an iteration"))


def _page(title: str, subtitle: str, body: list[str]) -> str:
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{CSS}{TREE_CSS}</style></head><body>",
        f"<header><h1>{html.escape(title)}</h1><p>{subtitle}</p></header><main>", *body, "</main></body></html>", ""])


def comparison_children(home: Path, compare_id: str) -> pl.DataFrame:
    """The runs a comparison trained (``runs.parent_run_id``); empty for an ordinary run."""
    text = (sql_dir() / "catalog" / "comparison_children.sql").read_text()
    return query(home, text, {"run_id": compare_id})


TREE_NOTE = ("Each tree: the prompt's root (m rollouts, predicted V̂), every agent turn (action → observation), "
             "branch points with the continuations bought there (K), the predicted V̂ and flip probability against "
             "the flips that happened, each leaf's reward and reason; continuations are marked blue.")


def _tree_section(home: Path, run_id: str, trees: int, prompt_id: str | None, title: str = "Rollout trees") -> str:
    blocks = render_trees(tree_nodes(home, run_id, trees=trees, prompt_id=prompt_id))
    which = f"prompt {html.escape(prompt_id)}" if prompt_id else f"the {trees} most wasteful (iteration, prompt) trees"
    body = "".join(blocks) or '<p class="none">no trees</p>'
    return (f'<section class="trees" id="trees"><h2>{html.escape(title)}</h2><p>{which}. {TREE_NOTE} '
            f"<code>trace-rl report {html.escape(run_id)} --trees N --prompt ID</code></p>{body}</section>")


#: the iteration columns a reader compares strategies by (the page shows every row, whole)
ITERATION_COLUMNS = ("run_id", "strategy", "iteration", "budget_used", "tokens", "effective_ratio",
                     "wasted_share", "accuracy_before", "accuracy")


def _learning_section(home: Path, compare_id: str, its: pl.DataFrame, strategies: list[str]) -> str:
    """Held-out accuracy against tokens and seconds with 95% CI bands over seeds, then the paired
    differences to the baseline and the tokens / seconds to its final accuracy."""
    text = (sql_dir() / "catalog" / "comparison_evaluations.sql").read_text()
    evals = query(home, text, {"run_id": compare_id})
    if not its.height or evals.height == 0 or evals["iteration"].n_unique() < 2:
        return ('<section class="whole"><h2>Learning curves</h2><p class="none">Fewer than two evaluations per '
                "run: train the comparison with <code>--set run.eval_every=N</code> to draw learning curves.</p>"
                "</section>")
    curves = curve_frame(its, evals)
    baseline = "grpo" if "grpo" in strategies else strategies[0]
    table, ctx = learning_table(curves, baseline=baseline, order=strategies)
    lines = learning_markdown(table, ctx).splitlines()
    head = [c.strip() for c in lines[2].strip("|").split("|")]
    # a ratio column is named after the column it divides: "tokens to target ×"
    head = [f"{head[i - 1]} {c}" if c == "×" else c for i, c in enumerate(head)]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[4:]]
    frame = pl.DataFrame(rows, schema=head, orient="row")
    images = [_png(lambda b: plot_learning_curves(curves, b, x="tokens")),
              _png(lambda b: plot_learning_curves(curves, b, x="seconds"))]
    imgs = "".join(f'<img alt="learning curves" src="{src}">' for src in images)
    return (f'<section class="whole"><h2>Learning curves</h2><p>{html.escape(lines[0])} Paired: each seed '
            f"against the same seed of {html.escape(baseline)}. <code>trace-rl sql iteration_summary --run-id "
            f"{html.escape(compare_id)}</code></p>"
            f'<div class="row">{imgs}</div>'
            f'<div class="row"><div class="tbl">{html_table(frame, drop=())}</div></div></section>')


def render_comparison_report(home: Path, compare_id: str, children: pl.DataFrame) -> str:
    """The page of a comparison id. It leads with the outcome (learning curves against tokens and
    seconds, paired differences, time-to-accuracy), then the budget and waste, every child's
    iterations, and each child's most wasteful tree."""
    q = {name: run_named_query(home, name, run_id=compare_id) for name in (
        "effective_ratio_by_strategy", "iteration_summary", "wasted_by_iteration", "budget_by_depth")}
    its = q["iteration_summary"]
    strategies = list(dict.fromkeys(children["strategy"].to_list())) if children.height else []
    whole = [c for c in ITERATION_COLUMNS if c in its.columns]
    sections = [
        _learning_section(home, compare_id, its, strategies),
        _section("Budget: effective ratio by strategy", ["effective_ratio_by_strategy"], compare_id,
                 [_png(lambda b: plot_effective_by_iteration(its, b))] if its.height else [],
                 [html_table(q["effective_ratio_by_strategy"])], "Pooled over the comparison's seeds."),
        _section("Child runs", [], compare_id, [], [html_table(children, drop=())]),
        _section("Iterations of every child", ["iteration_summary"], compare_id, [],
                 [html_table(its.select(whole), max_rows=400, drop=())], whole=True),
        _section("Waste by iteration", ["wasted_by_iteration"], compare_id, [],
                 [html_table(q["wasted_by_iteration"], max_rows=400, drop=())], whole=True),
        *[_tree_section(home, child, 1, None, f"Most wasteful tree of {child} ({strategy})")
          for child, strategy in children.select("run_id", "strategy").iter_rows()],
    ]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return _page(f"trace-rl comparison: {compare_id}",
                 f"{children.height} runs · home {html.escape(str(home.resolve()))} · written {stamp}", sections)


def render_html_report(home_dir: str | Path, run_id: str, *, trees: int = 3, prompt_id: str | None = None) -> str:
    """The report page of ``run_id`` (a finished run or one still training) as one HTML string;
    for a comparison id, the comparison's page. ``trees`` / ``prompt_id``: the rollout trees drawn."""
    home = Path(home_dir)
    if (children := comparison_children(home, run_id)).height:
        return render_comparison_report(home, run_id, children)
    q = {name: run_named_query(home, name, run_id=run_id) for name in (
        "iteration_summary", "wasted_by_iteration", "wasted_by_depth", "wasted_by_task", "wasted_by_difficulty",
        "allocation_histogram", "predictor_calibration_bins", "predictor_scores_by_iteration", "top_wasted_prompts")}
    check_run(home, run_id, q["iteration_summary"])
    by_it, its = q["wasted_by_iteration"], q["iteration_summary"]
    strategy = by_it["strategy"][0] if by_it.height else (its["strategy"][0] if its.height else "?")
    diff = q["wasted_by_difficulty"].with_columns(
        (pl.col("task") + " d" + pl.col("difficulty").cast(pl.Utf8)).alias("task_difficulty"))
    sections = [
        _section("Effective ratio per iteration", ["wasted_by_iteration", "iteration_summary"], run_id,
                 [_png(lambda b: plot_effective_ratio(by_it, b)), _png(lambda b: plot_accuracy(its, b))],
                 [html_table(by_it.drop("strategy"))],
                 "Share of generated trajectories in a group that holds both outcomes (root or branch group)."),
        _section("Waste by branching depth", ["wasted_by_depth"], run_id,
                 [_png(lambda b: plot_waste(q["wasted_by_depth"], "anchor_depth", b, title="Waste by depth",
                                            xlabel="anchor depth (0 = raw rollouts)"))],
                 [html_table(q["wasted_by_depth"])]),
        _section("Waste by task", ["wasted_by_task"], run_id,
                 [_png(lambda b: plot_waste(q["wasted_by_task"], "task", b, title="Waste by task", xlabel="task"))],
                 [html_table(q["wasted_by_task"])]),
        _section("Waste by difficulty", ["wasted_by_difficulty"], run_id,
                 [_png(lambda b: plot_waste(diff, "task_difficulty", b, title="Waste by task and difficulty",
                                            xlabel="task, difficulty"))],
                 [html_table(q["wasted_by_difficulty"])]),
        _section("Root allocation", ["allocation_histogram"], run_id,
                 [_png(lambda b: plot_allocation_histogram(q["allocation_histogram"], b))],
                 [html_table(q["allocation_histogram"])], "Candidate prompts per allocated rollout count m."),
        _section("Predictor calibration", ["predictor_calibration_bins", "predictor_scores_by_iteration"], run_id,
                 [_png(lambda b: plot_calibration(q["predictor_calibration_bins"], b))],
                 [html_table(q["predictor_calibration_bins"]), html_table(q["predictor_scores_by_iteration"])],
                 "Predictions made before the outcome, in ten bins of predicted success."),
        _section("Top wasted prompts", ["top_wasted_prompts"], run_id, [], [html_table(q["top_wasted_prompts"])]),
        _tree_section(home, run_id, trees, prompt_id),
    ]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return _page(f"trace-rl report: {run_id}", f"strategy {html.escape(str(strategy))} · home "
                 f"{html.escape(str(home.resolve()))} · written {stamp}", [_cards(by_it, its), *sections])


def write_html_report(home_dir: str | Path, run_id: str, out: str | Path, *, trees: int = 3,
                      prompt_id: str | None = None) -> Path:
    """Write the report page to ``out``, a regular file (``trace_core.analysis.outfile``: atomically)."""
    page = render_html_report(home_dir, run_id, trees=trees, prompt_id=prompt_id)
    return write_output(Path(out), page)
