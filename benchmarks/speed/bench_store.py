"""Node-store benchmark: ingest rate, every named query cold and warm, the catalogue's open time
and peak memory, over many generated nodes on disk (a temp dir, deleted after).

    PYTHONPATH=. python benchmarks/speed/bench_store.py --nodes 10_000_000
    PYTHONPATH=. python benchmarks/speed/bench_store.py --nodes 100_000_000 --tmp /tmp

Synthetic trees, one shard per iteration: every prompt has a root, 8 raw rollouts of 3 turns
and 2 continuations of 2 turns from the first rollout's first turn (29 nodes). Rewards are drawn
per prompt from Bernoulli(p_prompt), so groups are a mix of zero-contrast and mixed. Text
columns come from a small vocabulary; the token-id / logprob list columns are left null (the
figure is for the node table's scalar columns).
Every node carries its trajectory's anchor columns, as the flow's final shards do. Ids are short
decimal strings (the flow's are 16 hex digits). One iteration holds ~100k nodes by default (a
production iteration: 512 prompts x 16 rollouts x ~10 turns = ~80k), so 100M nodes are 1,000
iterations; each writes its node shard with its group summary (ShardWriter), its prompts,
predictions (one per root) and iteration row.
Goals: ingest >= 4M rows/s at 10M nodes; every named query < 1 s cold at 10M nodes and < 3 s at
100M (cold: shards evicted from the page cache, fresh DuckDB; warm: best of --repeats); the
catalogue file opens in < 1 s at 100M. Every figure is printed with the load average beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.home.groups import group_rows
from trace_core.home.queries import list_queries, load_query, run_named_query
from trace_core.home.shards import ShardWriter
from trace_core.nodes import NODE_SCHEMA
from trace_core.store import catalog_path, connect, ensure_catalog, open_catalog

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


CAVEAT = ("figures from a shared machine: other processes compete for the same cores, so times vary from run "
          "to run; compare figures taken minutes apart on the same machine only")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"[load {one:.1f}/{five:.1f} on {os.cpu_count()} cpus]"


def peak_rss() -> str:
    return f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"


def evict(home: Path) -> None:
    """Drop the shards from the OS page cache (POSIX_FADV_DONTNEED): the next query reads from disk."""
    for p in [*(home / "shards").rglob("*.parquet"), catalog_path(home)]:
        if not p.is_file():
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def side_tables(nodes: pl.DataFrame, iteration: int) -> dict[str, pl.DataFrame]:
    """The iteration's prompts (one per root), predictions (one per root) and iteration row."""
    roots = nodes.filter(pl.col("depth") == 0)
    leaves = nodes.filter(pl.col("is_leaf") & (pl.col("origin") == "raw"))
    counts = leaves.group_by("prompt_id").agg(pl.col("reward").sum().cast(pl.Int32).alias("n_success"),
                                              pl.len().cast(pl.Int32).alias("n_total"))
    prompts = roots.select("strategy", "iteration", "prompt_id", "task", "difficulty", "v_pred",
                           pl.lit(RAW, pl.Int32).alias("m_alloc")).join(counts, on="prompt_id", how="left")
    predictions = prompts.select("strategy", "iteration", pl.col("prompt_id").alias("node_id"), "prompt_id", "task",
                                 pl.lit("root").alias("kind"), "v_pred",
                                 (pl.col("n_success") / pl.col("n_total")).alias("outcome"),
                                 pl.col("n_total").cast(pl.Float32).alias("weight"))
    row = pl.DataFrame({"strategy": ["trace"], "iteration": [iteration], "budget_asked": [leaves.height],
                        "budget_used": [leaves.height], "tokens": [int(nodes["new_tokens"].sum())]})
    return {"prompts": prompts, "predictions": predictions, "iterations": row}


def ingest(home: Path, n_nodes: int, iterations: int) -> int:
    rng = np.random.default_rng(0)
    per_iter = max(1, n_nodes // iterations // PER_PROMPT)
    writer = ShardWriter(home, "bench")
    rows = groups = 0
    node_s = side_s = summary_s = node_cpu = 0.0
    for it in range(iterations):
        frame = synth_nodes(per_iter, it, "bench", rng)
        if it == 0:  # the summary's share of a node write, measured once on its own
            t0 = time.perf_counter()
            groups_per_iter = group_rows(frame).height
            summary_s = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), cpu_s()
        writer.write("nodes", frame, iteration=it, stage="final")  # + the partition's group and prompt summaries
        t1 = time.perf_counter()
        node_cpu += cpu_s() - c0
        for table, rows_ in side_tables(frame, it).items():
            writer.write(table, rows_, iteration=it, stage="final")
        side_s += time.perf_counter() - t1
        node_s += t1 - t0
        rows += frame.height
        groups += groups_per_iter
    size = sum(p.stat().st_size for p in (home / "shards" / "nodes").rglob("*.parquet"))
    gsize = sum(p.stat().st_size for p in (home / "shards" / "trajectory_groups").rglob("*.parquet"))
    psize = sum(p.stat().st_size for p in (home / "shards" / "prompt_groups").rglob("*.parquet"))
    print(f"ingest: {rows:,} nodes in {iterations} iterations ({per_iter * PER_PROMPT:,} nodes each), "
          f"{node_s:.1f} s -> {rows / node_s / 1e6:.2f} M node rows/s (CPU {node_cpu:.1f} s: "
          f"{rows / node_cpu / 1e6:.2f} M rows per CPU second) {load()}")
    print(f"  each iteration: node shard + its group and prompt summaries (~{groups_per_iter:,} groups, computed in "
          f"{summary_s:.3f} s of {node_s / iterations:.3f} s), through ShardWriter (temp file, fsync, rename); "
          f"prompts / predictions / iteration rows {side_s:.1f} s more")
    print(f"  on disk: nodes {size / 2**20:,.0f} MiB, group summaries {gsize / 2**20:,.0f} MiB ({groups:,} rows), "
          f"prompt summaries {psize / 2**20:,.0f} MiB; "
          f"{peak_rss()}")
    return rows


def cpu_s() -> float:
    """CPU seconds of this process, DuckDB's and polars' threads included: what a figure costs
    whatever the load (under load the wall-clock figures mostly measure the wait for a core)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(home: Path, name: str) -> tuple[float, float, int]:
    t0, c0 = time.perf_counter(), cpu_s()
    out = run_named_query(home, name, run_id="bench")
    return time.perf_counter() - t0, cpu_s() - c0, out.height


def catalogue_open(home: Path, repeats: int) -> None:
    """The catalogue file: built once (its first open), then opened read-only as an analyst does
    (``duckdb -readonly DIR/trace.duckdb``), cold and warm, with a first query on it."""
    catalog_path(home).unlink(missing_ok=True)
    t0 = time.perf_counter()
    ensure_catalog(home)
    built = time.perf_counter() - t0

    def once() -> float:
        t0 = time.perf_counter()
        with open_catalog(home) as con:
            con.execute("SELECT count(*) FROM runs").fetchall()
        return time.perf_counter() - t0

    evict(home)
    cold = once()
    warm = min(once() for _ in range(repeats))
    t0 = time.perf_counter()
    connect(home).close()  # schema shards and summaries checked, every view created
    conn = time.perf_counter() - t0
    t0 = time.perf_counter()
    connect(home, only_for=load_query("wasted_by_depth")).close()  # what a named query over groups pays
    conn_groups = time.perf_counter() - t0
    print(f"catalogue: built {built:.3f} s; opened read-only + first query cold {cold:.3f} s, warm {warm:.3f} s; "
          f"Python connect {conn:.3f} s (every view), {conn_groups:.3f} s (a query over groups) {load()}")


def queries(home: Path, rows: int, repeats: int) -> str:
    slowest, worst = "", 0.0
    for name in list_queries():
        evict(home)
        cold, cold_cpu, n = timed(home, name)
        warm, warm_cpu, _ = min(timed(home, name) for _ in range(repeats))
        print(f"query {name:34s} cold {cold:6.3f} s (cpu {cold_cpu:5.2f} s)  warm {warm:6.3f} s (cpu {warm_cpu:5.2f} s)"
              f"  ({rows:,} nodes -> {n} rows) {load()}")
        if max(cold, warm) > worst:
            slowest, worst = name, max(cold, warm)
    print(f"after the queries: {peak_rss()}")
    return slowest


def pruning(home: Path, iterations: int) -> None:
    """EXPLAIN ANALYZE: files skipped by the hive path (Python views), row groups by statistics
    (the catalogue file reads without hive partitioning), in the sorted group summaries too."""
    it = iterations // 2
    checks = [
        ("Python views, nodes of one iteration (hive path)", connect,
         f"SELECT count(*) FROM nodes WHERE run_id = 'bench' AND iteration = {it}"),
        ("catalogue file, nodes of one iteration (row-group statistics)", open_catalog,
         f"SELECT count(*) FROM nodes WHERE run_id = 'bench' AND iteration = {it}"),
        ("catalogue file, groups of one task at depth > 0 (sorted summaries)", open_catalog,
         "SELECT count(*) FROM trajectory_groups WHERE task = 'qa' AND anchor_depth > 0"),
    ]
    for what, opener, sql in checks:
        with opener(home) as con:
            t0 = time.perf_counter()
            profile = json.loads(con.execute("EXPLAIN (ANALYZE, FORMAT json) " + sql).fetchall()[0][1])
            took = time.perf_counter() - t0
        q = profile.get("query", {})
        files = [op["extra_info"].get("Total Files Read") for op in _operators(profile)
                 if op.get("type") == "TABLE_SCAN" and op.get("rows_scanned")]
        print(f"pruning: {what}: {took:.3f} s; row groups scanned {q.get('total_row_groups_scanned')} of "
              f"{q.get('total_row_groups_to_scan')}, {q.get('total_rows_scanned', 0):,} rows, "
              f"files read {'+'.join(map(str, files))}\n    {sql}")
    with connect(home) as con:
        meta = con.execute("SELECT row_group_id, stats_min_value, stats_max_value FROM parquet_metadata("
                           f"'{home}/shards/trajectory_groups/run_id=bench/iteration={it:05d}/summary.parquet') "
                           "WHERE path_in_schema = 'task' ORDER BY 1").fetchall()
    print(f"  group summary of iteration {it}: {len(meta)} row groups, task min/max per row group: "
          + ", ".join(f"{lo}..{hi}" for _, lo, hi in meta[:8]))


def _operators(node: dict):
    for child in node.get("operator", node.get("children", [])):
        yield child
        yield from _operators(child)


def bench(home: Path, n_nodes: int, iterations: int, repeats: int, skip_ingest: bool = False) -> None:
    print(f"{CAVEAT}; {load()}; DuckDB threads {os.environ.get('TRACE_RL_DUCKDB_THREADS')}, "
          f"memory_limit {os.environ.get('TRACE_RL_DUCKDB_MEMORY_LIMIT')}")
    if skip_ingest:  # a home a previous --home run wrote: its queries again
        with connect(home) as con:
            rows = con.execute("SELECT count(*) FROM nodes").fetchone()[0]
            iterations = con.execute("SELECT count(DISTINCT iteration) FROM trajectory_groups").fetchone()[0]
    else:
        rows = ingest(home, n_nodes, iterations)
    catalogue_open(home, repeats)
    slowest = queries(home, rows, repeats)
    with connect(home) as con:
        plan = con.execute("EXPLAIN (ANALYZE, FORMAT json) " + load_query(slowest), {"run_id": "bench"}).fetchall()
        profile = json.loads(plan[0][1])
        print(f"\nEXPLAIN ANALYZE of the slowest, {slowest} (warm; operator, rows out, CPU seconds summed over "
              f"threads; DuckDB peak buffer memory {profile['system']['peak_buffer_memory'] / 2**20:.0f} MiB):")
        print_plan(profile)
    print()
    pruning(home, iterations)


def print_plan(node: dict, depth: int = 0) -> None:
    """One line per operator of DuckDB's JSON profile, children indented (tree width stays readable)."""
    for child in node.get("operator", node.get("children", [])):
        name = child.get("name", "?")
        if name not in ("RESULT_COLLECTOR", "EXPLAIN_ANALYZE", "PROJECTION"):
            info = child.get("extra_info", {})
            what = {k: info[k] for k in ("Groups", "Aggregates", "Join Type", "Conditions", "Filters",
                                         "Total Files Read") if k in info}
            print(f"{'  ' * depth}{name:<16} {child.get('intermediate_rows', 0):>11,} rows "
                  f"{child.get('timing', 0):7.3f} s  {json.dumps(what)[:150] if what else ''}")
            print_plan(child, depth + 1)
        else:
            print_plan(child, depth)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=lambda s: int(s.replace("_", "")), default=10_000_000)
    ap.add_argument("--iterations", type=int, default=None,
                    help="iterations, one node shard each (default: one per ~100k nodes)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--home", type=Path, default=None, help="store directory, kept (default: a temp dir, deleted)")
    ap.add_argument("--tmp", type=Path, default=None, help="where the temp dir goes (default: the system's)")
    ap.add_argument("--skip-ingest", action="store_true", help="with --home: time the queries of the store a "
                    "previous --home run left there, without writing it again")
    args = ap.parse_args()
    # DuckDB on a machine shared with training: two threads and a memory cap unless told otherwise
    os.environ.setdefault("TRACE_RL_DUCKDB_THREADS", "2")
    os.environ.setdefault("TRACE_RL_DUCKDB_MEMORY_LIMIT", "8GB")
    iterations = args.iterations or max(1, round(args.nodes / 100_000))
    if args.home is not None:
        bench(args.home, args.nodes, iterations, args.repeats, args.skip_ingest)
        return
    if args.skip_ingest:
        ap.error("--skip-ingest needs --home (the store a previous --home run left)")
    tmp = Path(tempfile.mkdtemp(prefix="bench_store_", dir=args.tmp))
    try:
        bench(tmp, args.nodes, iterations, args.repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
