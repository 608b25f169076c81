"""Strategies side by side at equal budget: every strategy trains from the same warm-start
checkpoint, on the same prompt stream (same seeds), with the same trajectories per iteration.
Child runs are nested under one MLflow parent; all rows land in one store with a ``strategy``
column, so the named SQL queries compare them."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import polars as pl
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.train import named_run_id, train_flow
from tasks.artifacts import name_flow_run, prefect_link_tags
from trace_core.allocation.strategies import (
    GROUP_SIZE_STRATEGIES,
    ROOT_VALUE_STRATEGIES,
    for_strategy,
    strategy_names,
)
from trace_core.analysis.compare import comparison_markdown, comparison_table
from trace_core.analysis.learning import at_budget, curve_frame, learning_markdown, learning_table, mean_ci
from trace_core.config import TrainConfig
from trace_core.home.layout import table_dir
from trace_core.stages.run import RunRef
from tracking.links import git_state
from tracking.mlflow_tracker import Tracker
from tracking.plots_compare import plot_accuracy_vs_tokens, plot_effective_by_iteration, plot_learning_curves
from tracking.run_tracker import trained_params


@dataclass(frozen=True)
class Variant:
    """One row of a comparison: a strategy, optionally at its own group size (``grpo@4``), with
    the planner fed sampled success rates (``trace@oracle8``: ``predictor.oracle_samples``) or with
    candidate prompts valued under their posterior (``trace@posterior``, ``trace@thompson``)."""

    label: str
    strategy: str
    group_size: int | None = None
    oracle_samples: int | None = None
    oracle_roots_only: bool = False
    max_staleness: int | None = None
    root_values: str | None = None  # "posterior" or "thompson": the strategy's root_<that> knob on
    reference: bool = False  # predictor.reference on: the roots' demonstration score
    refill: bool = False  # trace.refill on: dynamic sampling chosen by the root rule
    history_shift: bool = False  # predictor.history_shift on: the roots' record re-weighted to the policy
    grow_first: int | None = None  # trace.grow_first: adaptive groups, the first episodes of each prompt

    def apply(self, base: TrainConfig) -> TrainConfig:
        """``base`` as this row trains it: the shared allocation fields, the strategy's own section,
        and the row's overrides."""
        cfg = base.model_copy(deep=True)
        cfg.allocation = for_strategy(base.allocation, self.strategy)
        if self.group_size is not None:
            cfg.allocation.group_size = self.group_size
        if self.oracle_samples is not None:
            cfg.predictor.oracle_samples = self.oracle_samples
            cfg.predictor.oracle_stages = "roots" if self.oracle_roots_only else "both"
        if self.max_staleness is not None:
            cfg.run.max_staleness = self.max_staleness
        if self.root_values is not None:
            cfg.allocation = cfg.allocation.with_knobs(self.strategy, **{f"root_{self.root_values}": True})
        if self.reference:
            cfg.predictor.reference.enabled = True
        if self.refill:
            cfg.allocation = cfg.allocation.with_knobs(self.strategy, refill=True)
        if self.history_shift:
            cfg.predictor.history_shift.enabled = True
        if self.grow_first is not None:
            cfg.allocation = cfg.allocation.with_knobs(self.strategy, grow_first=self.grow_first)
        return TrainConfig.model_validate(cfg.model_dump())


def parse_variant(text: str, known: list[str]) -> Variant:
    """``NAME[@N][@oracleK|@rootoracleK][@staleS][@posterior|@thompson][@reference][@refill][@histshift][@growN]``: strategy NAME,
    group size N (uniform-root strategies only), K oracle samples per candidate prompt and open
    prefix (``rootoracle``: per candidate prompt only, prefixes stay predicted), the pipelined flow
    at ``run.max_staleness: S``, candidate prompts valued under their posterior (``root_posterior``)
    or planned on a posterior draw (``root_thompson``), the roots' reference term
    (``predictor.reference``; these three trace and trace-root only), dynamic sampling chosen by
    the root rule (``trace.refill``, trace only), the roots' record re-weighted to the policy
    (``predictor.history_shift``, trace and trace-root), adaptive groups of N first episodes per
    prompt (``trace.grow_first``, trace only); a ValueError says what is wrong in one line."""
    name, *mods = [part.strip() for part in text.strip().split("@")]
    if name not in known:
        raise ValueError(f"unknown strategy {name!r} in {text!r}; known: {', '.join(known)}")
    group = oracle = stale = values = grow = None
    roots_only = reference = refill = shift = False
    for mod in mods:
        if mod.isdigit() and 1 <= int(mod) <= 64 and group is None:
            if name not in GROUP_SIZE_STRATEGIES:
                raise ValueError(f"{text!r}: {name} does not read a group size (only {', '.join(GROUP_SIZE_STRATEGIES)})")
            group = int(mod)
        elif (m := re.fullmatch(r"(root)?oracle(\d+)", mod)) and 1 <= int(m[2]) <= 64 and oracle is None:
            oracle, roots_only = int(m[2]), bool(m[1])
        elif (m := re.fullmatch(r"stale(\d+)", mod)) and 1 <= int(m[1]) <= 8 and stale is None:
            stale = int(m[1])
        elif mod in ("posterior", "thompson") and values is None:
            if name not in ROOT_VALUE_STRATEGIES:
                raise ValueError(f"{text!r}: {name} has no root_{mod} (only {', '.join(ROOT_VALUE_STRATEGIES)})")
            values = mod
        elif mod == "reference" and not reference:
            if name not in ROOT_VALUE_STRATEGIES:
                raise ValueError(f"{text!r}: {name} has no predicted roots to score (only {', '.join(ROOT_VALUE_STRATEGIES)})")
            reference = True
        elif mod == "refill" and not refill:
            if name != "trace":
                raise ValueError(f"{text!r}: only trace has a refill chosen by the root rule (dapo refills by default)")
            refill = True
        elif mod == "histshift" and not shift:
            if name not in ROOT_VALUE_STRATEGIES:
                raise ValueError(f"{text!r}: {name} has no predicted roots to shift (only {', '.join(ROOT_VALUE_STRATEGIES)})")
            shift = True
        elif (m := re.fullmatch(r"grow(\d+)", mod)) and 1 <= int(m[1]) <= 64 and grow is None:
            if name != "trace":
                raise ValueError(f"{text!r}: only trace grows its groups (trace.grow_first)")
            grow = int(m[1])
        else:
            raise ValueError(f"{text!r}: {mod!r} is neither a group size (1-64), oracleK / rootoracleK (K 1-64), "
                             "staleS (S 1-8), posterior / thompson, reference, refill, histshift nor growN (N 1-64), once each")
    label = (name + (f"@{group}" if group is not None else "")
             + (f"@{'root' if roots_only else ''}oracle{oracle}" if oracle is not None else "")
             + (f"@stale{stale}" if stale is not None else "") + (f"@{values}" if values is not None else "")
             + ("@reference" if reference else "") + ("@refill" if refill else "")
             + ("@histshift" if shift else "") + (f"@grow{grow}" if grow is not None else ""))
    return Variant(label, name, group, oracle, roots_only, stale, values, reference, refill, shift, grow)


def child_run_id(compare_id: str, strategy: str, seed: int) -> str:
    """``strategy`` is the row's label; ``@`` (a variant's marker) becomes ``-`` in the run id."""
    return f"{compare_id}-{strategy.replace('@', '-')}-s{seed}"


def read_table(home: str, table: str, run_ids: list[str], labels: dict[str, str] | None = None) -> pl.DataFrame:
    """The rows of ``table`` (iterations, evaluations) written by ``run_ids``; with ``labels``
    (run id -> row label), the ``strategy`` column holds each run's row label (``grpo@4``)."""
    files = sorted(f for r in run_ids for f in (table_dir(home, table) / f"run_id={r}").glob("iteration=*/final.parquet"))
    if not files:
        return pl.DataFrame()
    rows = pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed").filter(pl.col("run_id").is_in(run_ids))
    if labels and "strategy" in rows.columns:
        rows = rows.with_columns(pl.col("run_id").replace_strict(labels, default=pl.col("strategy")).alias("strategy"))
    return rows


def read_iterations(home: str, run_ids: list[str], labels: dict[str, str] | None = None) -> pl.DataFrame:
    return read_table(home, "iterations", run_ids, labels)


def learning_section(home: str, children: list[str], strategies: list[str], out,
                     labels: dict[str, str] | None = None) -> tuple[str, list]:
    """The learning curves of a comparison: table (markdown) and plots, from the children's
    ``evaluations`` and ``iterations`` rows; empty when fewer than two evaluations were made.
    The baseline row is plain ``grpo`` when present, else the first row."""
    evals = read_table(home, "evaluations", children, labels)
    if evals.height == 0 or evals["iteration"].n_unique() < 2:
        return "", []
    curves = curve_frame(read_iterations(home, children, labels), evals)
    baseline = "grpo" if "grpo" in strategies else strategies[0]
    table, ctx = learning_table(curves, baseline=baseline, order=strategies)
    curves.write_csv(out / "learning_curves.csv")
    table.write_csv(out / "learning.csv")
    plots = [plot_learning_curves(curves, out / "learning_tokens.png", x="tokens"),
             plot_learning_curves(curves, out / "learning_seconds.png", x="seconds")]
    plots += [plot_learning_curves(curves, out / f"learning_tokens_{f}.png", family=f)
              for f in sorted(set(curves["family"].to_list()) - {"all"})]
    lines = ["## Learning curves", "", learning_markdown(table, ctx), ""]
    per_family = []
    for f in sorted(set(curves["family"].to_list()) - {"all"}):
        pts = at_budget(curves, (1.0,), family=f)
        cells = [f"{s} {100 * mean_ci(pts.filter(pl.col('strategy') == s)['accuracy'])[0]:.1f}"
                 for s in strategies if pts.filter(pl.col("strategy") == s).height]
        per_family.append(f"* {f}: " + ", ".join(cells))
    lines += ["Per family at the last token checkpoint (%):", "", *per_family, ""]
    return "\n".join(lines), plots + [out / "learning.csv", out / "learning_curves.csv"]


@task(name="train-child", task_run_name="train-child {run_id}", cache_policy=NO_CACHE)
def train_child(config: TrainConfig, run_id: str, home: str, tracking_uri: str | None,
                parent_tracking_run: str) -> str:
    """One child of a comparison: a whole training run (its own flow run; own process when fanned out)."""
    train_flow(config, run_id=run_id, home=home, tracking_uri=tracking_uri, parent_tracking_run=parent_tracking_run)
    return run_id


def compare_run_name() -> str:
    """The comparison's flow run name: its id (``cmp-<time>`` when none is given), from the start."""
    from prefect.runtime import flow_run

    return flow_run.get_parameters().get("run_id") or f"cmp-{time.strftime('%Y%m%d-%H%M%S')}"


@flow(name="trace-compare", log_prints=True, flow_run_name=compare_run_name)
def compare_flow(config: TrainConfig, strategies: list[str], seeds: int = 1, home: str = ".trace-home",
                 run_id: str | None = None, tracking_uri: str | None = None, parallel: int = 0,
                 ray_address: str | None = None) -> dict:
    """Train each of ``strategies`` for each of ``seeds`` seeds; report the table and plots.

    ``parallel``: 0 trains the children one after another in this process; N >= 1 fans them out as
    Ray tasks (prefect-ray), at most N at once on a local Ray, or on the cluster at ``ray_address``.
    Every child is independent (own run id, seeds, process), so the numbers equal the serial run's.
    A strategy may carry a variant (``grpo@4``: group size 4; ``trace@oracle8``: the oracle bound with 8
    samples per candidate, ``parse_variant``): each variant is its own row of the tables."""
    if parallel < 0:
        raise ValueError(f"parallel must be >= 0, got {parallel}")
    base = TrainConfig.model_validate(config)
    cid = run_id or named_run_id() or f"cmp-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_id is None:
        name_flow_run(cid)
    log = get_run_logger()
    tcfg = base.tracking.model_copy(update={"tracking_uri": tracking_uri or base.tracking.tracking_uri})
    parent = Tracker(home, cid, config=tcfg, tags={"trace_rl.kind": "compare"})
    parent.set_tags({**git_state(), **prefect_link_tags()})
    # the config as the children log it: `model` states the loaded checkpoint's sizes and path, not
    # the size fields that only shape a model built from scratch
    parent.log_params({"strategies": ",".join(strategies), "seeds": seeds, **trained_params(base)})
    variants = [parse_variant(s, strategy_names()) for s in strategies]
    strategies = [v.label for v in variants]
    if len(set(strategies)) < len(strategies):
        raise ValueError(f"strategies: a row is named twice in {', '.join(strategies)}")
    jobs, labels = [], {}
    for seed in range(seeds):
        for var in variants:
            cfg = var.apply(base)  # each child: the shared section's settings its strategy reads
            cfg.run.seed = base.run.seed + seed
            jobs.append((TrainConfig.model_validate(cfg.model_dump()), child_run_id(cid, var.label, seed)))
            labels[jobs[-1][1]] = var.label
            log.info("compare %s: %s seed %d -> run %s", cid, var.label, seed, jobs[-1][1])
    kw = {"home": home, "tracking_uri": tracking_uri, "parent_tracking_run": cid}
    if parallel:  # one Ray task per child, at most `parallel` at once on a local Ray (or all on a cluster)
        from prefect_ray import RayTaskRunner

        init = {"num_cpus": parallel, "include_dashboard": False} if not ray_address else {}
        with RayTaskRunner(address=ray_address, init_kwargs=init) as runner:
            futures = [runner.submit(train_child, {"config": c, "run_id": r, **kw}) for c, r in jobs]
            children = [f.result() for f in futures]
    else:
        children = [train_child.fn(c, r, **kw) for c, r in jobs]
    iterations = read_iterations(home, children, labels)
    table = comparison_table(iterations, order=strategies)
    out = RunRef(home, cid).artifacts_dir
    out.mkdir(parents=True, exist_ok=True)
    plots = [plot_effective_by_iteration(iterations, out / "effective_ratio_by_iteration.png"),
             plot_accuracy_vs_tokens(iterations, out / "accuracy_vs_tokens.png")]
    learning, learning_files = learning_section(home, children, strategies, out, labels)
    md = "\n".join([f"# Strategy comparison {cid}", "",
                     f"{len(strategies)} strategies x {seeds} seed(s), {base.run.iterations} iterations, "
                     f"{base.allocation.budget_total} trajectories per iteration each; mean ± 95% CI over seeds.",
                     "", learning, "## Budget", "", comparison_markdown(table), ""]
                    + [f"![{p.stem}]({p.name})" for p in [*plots, *learning_files] if p.suffix == ".png"])
    (out / "compare.md").write_text(md)
    table.write_csv(out / "compare.csv")
    for p in [*plots, *learning_files, out / "compare.csv"]:
        parent.log_artifact(p)
    parent.log_text(md, "compare.md")
    parent.finish()
    create_markdown_artifact(key=f"compare-{cid}".lower().replace("_", "-")[:100], markdown=md)
    # the same report for a terminal: image links name their directory
    printed = re.sub(r"!\[([^\]]*)\]\(([^)/]+\.png)\)", lambda m: f"![{m[1]}]({out / m[2]})", md)
    return {"compare_id": cid, "runs": children, "report": printed, "report_path": str(out / "compare.md"),
            "table": table.to_dicts(), "learning": learning}
