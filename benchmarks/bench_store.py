"""Node-store benchmark: Parquet ingest rate and the wasted-rollout query over many nodes.

    PYTHONPATH=. python benchmarks/bench_store.py --nodes 10_000_000

Synthetic trees, one shard per iteration: every prompt has a root, 8 raw rollouts of 3 turns
and 2 continuations of 2 turns from the first rollout's first turn (29 nodes). Rewards are drawn
per prompt from Bernoulli(p_prompt), so groups are a mix of zero-contrast and mixed. Text
columns come from a small vocabulary; the token-id / logprob list columns are left null (the
figure is for the node table's scalar columns).
Every node carries its trajectory's anchor columns, as the flow's final shards do. Ids are short
decimal strings (the flow's are 16 hex digits). Goals (issue 15): ingest >= 2M rows/s; every
named wasted-rollout query < 1 s over 10M nodes, cold (shards evicted from the page cache, fresh
DuckDB) and warm.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.home.queries import load_query, run_named_query
from trace_core.home.shards import ShardWriter
from trace_core.nodes import NODE_SCHEMA
from trace_core.store import connect

RAW, TURNS, EXT, EXT_TURNS = 8, 3, 2, 2
PER_PROMPT = 1 + RAW * TURNS + EXT * EXT_TURNS  # 29 nodes
ACTIONS = ["<tool>calc(12*7)</tool>", "<tool>search(capital of France)</tool>", "<answer>84</answer>"]


def _template() -> dict[str, np.ndarray]:
    """One prompt's tree with local indices: node, parent (-1 = none), trajectory, depth, leaf."""
    node, parent, traj, depth, origin = [0], [-1], [-1], [0], [0]
    for j in range(RAW):
        for t in range(1, TURNS + 1):
            node.append(len(node))
            parent.append(0 if t == 1 else node[-2])
            traj.append(j), depth.append(t), origin.append(1)
    anchor = 1  # raw rollout 0 after its first turn
    for e in range(EXT):
        for t in range(2, 2 + EXT_TURNS):
            node.append(len(node))
            parent.append(anchor if t == 2 else node[-2])
            traj.append(RAW + e), depth.append(t), origin.append(2)
    anchor = [-1] + [0] * (RAW * TURNS) + [anchor] * (EXT * EXT_TURNS)  # the node each trajectory branched from
    owner = [-1] * (1 + RAW * TURNS) + [0] * (EXT * EXT_TURNS)  # the trajectory through that node (raw rollout 0)
    arr = {k: np.array(v) for k, v in dict(node=node, parent=parent, traj=traj, depth=depth, origin=origin,
                                            anchor=anchor, owner=owner).items()}
    last = {}
    for i, tj in enumerate(arr["traj"]):
        last[tj] = i
    arr["leaf"] = np.isin(np.arange(len(node)), [i for tj, i in last.items() if tj >= 0])
    return arr


def synth_nodes(n_prompts: int, iteration: int, run_id: str, rng: np.random.Generator) -> pl.DataFrame:
    tpl = _template()
    base = (np.arange(n_prompts, dtype=np.int64) + iteration * 10_000_000)[:, None]
    node = (base * PER_PROMPT + tpl["node"]).ravel()
    parent = np.where(tpl["parent"] >= 0, base * PER_PROMPT + tpl["parent"], -1).ravel()
    traj = np.where(tpl["traj"] >= 0, base * 16 + tpl["traj"], -1).ravel()
    p = rng.beta(0.6, 0.6, size=(n_prompts, 1))  # many prompts near 0 or 1: zero-contrast groups
    reward = (rng.random((n_prompts, RAW + EXT)) < p).astype(np.float32)
    leaf_reward = np.where(tpl["leaf"], reward[:, np.clip(tpl["traj"], 0, None)], np.nan).ravel()
    n = node.size
    anchor = np.where(tpl["anchor"] >= 0, base * PER_PROMPT + tpl["anchor"], -1).ravel()
    owner = np.where(tpl["owner"] >= 0, base * 16 + tpl["owner"], -1).ravel()
    frame = pl.DataFrame({
        "node_id": node, "parent_id": parent, "trajectory_id": traj, "anchor_id": anchor, "owner": owner,
        "prompt_idx": np.repeat(base.ravel(), PER_PROMPT),
        "depth": np.tile(tpl["depth"], n_prompts).astype(np.int32),
        "origin_code": np.tile(tpl["origin"], n_prompts),
        "is_leaf": np.tile(tpl["leaf"], n_prompts),
        "reward": leaf_reward,
        "v_pred": rng.random(n, dtype=np.float32),
        "new_tokens": rng.integers(5, 60, n, dtype=np.int32),
        "action_idx": rng.integers(0, len(ACTIONS), n),
    })
    return frame.select(
        pl.lit(run_id).alias("run_id"),
        pl.lit("trace").alias("strategy"),
        pl.lit(iteration, dtype=pl.Int32).alias("iteration"),
        pl.col("node_id").cast(pl.Utf8),
        pl.when(pl.col("parent_id") >= 0).then(pl.col("parent_id").cast(pl.Utf8)).alias("parent_id"),
        ("p" + pl.col("prompt_idx").cast(pl.Utf8)).alias("prompt_id"),
        pl.when(pl.col("trajectory_id") >= 0).then(pl.col("trajectory_id").cast(pl.Utf8)).alias("trajectory_id"),
        pl.when(pl.col("anchor_id") >= 0).then(pl.col("anchor_id").cast(pl.Utf8)).alias("anchor_id"),
        pl.when(pl.col("owner") >= 0).then(pl.col("owner").cast(pl.Utf8)).alias("anchor_trajectory_id"),
        pl.col("prompt_idx").mod(3).replace_strict({0: "math", 1: "qa", 2: "fc"}, return_dtype=pl.Utf8).alias("task"),
        pl.col("prompt_idx").mod(5).cast(pl.Int32).alias("difficulty"),
        "depth",
        pl.col("origin_code").replace_strict({0: "root", 1: "raw", 2: "extension"}, return_dtype=pl.Utf8)
        .alias("origin"),
        pl.col("action_idx").replace_strict(dict(enumerate(ACTIONS)), return_dtype=pl.Utf8).alias("action_text"),
        pl.lit("result: 84").alias("observation_text"),
        "new_tokens", "is_leaf",
        pl.col("reward").fill_nan(None).cast(pl.Float32),
        "v_pred",
        pl.lit(0.1, dtype=pl.Float32).alias("advantage"),
        pl.lit(0, dtype=pl.Int32).alias("tool_errors"),
        pl.lit(0.02, dtype=pl.Float32).alias("gen_seconds"),
    ).with_columns(pl.lit(None, dtype=dt).alias(c) for c, dt in NODE_SCHEMA.items() if c not in (
        "run_id", "strategy", "iteration", "node_id", "parent_id", "prompt_id", "trajectory_id", "task",
        "difficulty", "depth", "origin", "anchor_id", "anchor_trajectory_id", "action_text", "observation_text", "new_tokens", "is_leaf", "reward",
        "v_pred", "advantage", "tool_errors", "gen_seconds")).select(list(NODE_SCHEMA))


WASTED = ("wasted_by_iteration", "wasted_by_task", "wasted_by_depth", "wasted_by_difficulty", "top_wasted_prompts",
          "effective_ratio_by_strategy", "budget_by_depth")
CAVEAT = ("figures from a shared machine: other processes compete for the same cores, so times vary from run "
          "to run; compare figures taken minutes apart on the same machine only")


def evict(home: Path) -> None:
    """Drop the shards from the OS page cache (POSIX_FADV_DONTNEED): the next query reads from disk."""
    for p in (home / "shards").rglob("*.parquet"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def ingest(home: Path, n_nodes: int, iterations: int) -> int:
    rng = np.random.default_rng(0)
    per_iter = max(1, n_nodes // iterations // PER_PROMPT)
    writer = ShardWriter(home, "bench")
    rows, write_s = 0, 0.0
    for it in range(iterations):
        frame = synth_nodes(per_iter, it, "bench", rng)
        t0 = time.perf_counter()
        writer.write("nodes", frame, iteration=it, stage="final")
        write_s += time.perf_counter() - t0
        rows += frame.height
    size = sum(p.stat().st_size for p in (home / "shards" / "nodes").rglob("*.parquet"))
    print(f"ingest: {rows:,} nodes in {iterations} shards, {write_s:.2f} s -> {rows / write_s / 1e6:.2f} M rows/s "
          f"({size / 2**20:.0f} MiB Parquet, ShardWriter: temp file, fsync, rename, fsync of the directory)")
    return rows


def timed(home: Path, name: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = run_named_query(home, name, run_id="bench")
    return time.perf_counter() - t0, out.height


def bench(home: Path, n_nodes: int, iterations: int, repeats: int) -> None:
    rows = ingest(home, n_nodes, iterations)
    print(f"{CAVEAT}; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    slowest, worst = None, 0.0
    for name in WASTED:
        evict(home)
        cold, n = timed(home, name)
        warm = min(timed(home, name)[0] for _ in range(repeats))
        print(f"query {name:28s} cold {cold:6.3f} s  warm {warm:6.3f} s  ({rows:,} nodes -> {n} rows)")
        if max(cold, warm) > worst:
            slowest, worst = name, max(cold, warm)
    with connect(home) as con:
        plan = con.execute("EXPLAIN (ANALYZE, FORMAT json) " + load_query(slowest), {"run_id": "bench"}).fetchall()
        print(f"\nEXPLAIN ANALYZE of the slowest, {slowest} (warm; operator, rows out, CPU seconds summed over "
              f"threads):")
        print_plan(json.loads(plan[0][1]))
        it = iterations // 2
        print(f"\npruning: EXPLAIN ANALYZE SELECT count(*) FROM nodes WHERE run_id = 'bench' AND iteration = {it}")
        plan = con.execute(f"EXPLAIN ANALYZE SELECT count(*) FROM nodes WHERE run_id = 'bench' AND iteration = {it}")
        print("\n".join(line.strip(" │") for line in plan.fetchall()[0][1].splitlines()
                        if "Files" in line or "Filters:" in line))
    print(run_named_query(home, "wasted_by_iteration", run_id="bench").head(3))


def print_plan(node: dict, depth: int = 0) -> None:
    """One line per operator of DuckDB's JSON profile, children indented (tree width stays readable)."""
    for child in node.get("operator", node.get("children", [])):
        name = child.get("name", "?")
        if name not in ("RESULT_COLLECTOR", "EXPLAIN_ANALYZE", "PROJECTION"):
            info = child.get("extra_info", {})
            what = {k: info[k] for k in ("Groups", "Aggregates", "Join Type", "Conditions", "Filters",
                                         "Total Files Read") if k in info}
            print(f"{'  ' * depth}{name:<16} {child.get('intermediate_rows', 0):>11,} rows {child.get('timing', 0):7.3f} s"
                  f"  {json.dumps(what)[:150] if what else ''}")
            print_plan(child, depth + 1)
        else:
            print_plan(child, depth)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=lambda s: int(s.replace("_", "")), default=10_000_000)
    ap.add_argument("--iterations", type=int, default=10, help="shards (one per iteration)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--home", type=Path, default=None, help="store directory (default: a temp dir)")
    args = ap.parse_args()
    print(f"cpus: {os.cpu_count()}")
    if args.home is not None:
        bench(args.home, args.nodes, args.iterations, args.repeats)
        return
    with tempfile.TemporaryDirectory(prefix="bench_store_") as tmp:
        bench(Path(tmp), args.nodes, args.iterations, args.repeats)


if __name__ == "__main__":
    main()
