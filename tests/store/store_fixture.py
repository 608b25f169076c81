"""A small, hand-checkable store: two runs, a few prompts, raw rollouts and prefix extensions.

Run r1 (strategy trace), every non-root node costs 10 tokens:

iteration 0
  A (math, d1): raw a1 (2 turns, r=1), a2 (2 turns, r=0)      root group {1,0}: effective
                extension e1 from a1's turn 1 (1 turn, r=1)   group {e1=1, a1=1}: wasted
  B (qa, d2):   raw b1 (r=0), b2 (r=0)                         wasted, wasted
  C (qa, d2):   raw c1 (r=1), alone                            group of one: wasted
iteration 1
  A (math, d1): raw a3 (r=1), a4 (r=1)                         wasted, wasted
  D (fc, d3):   raw d1 (2 turns, r=0), d2 (2 turns, r=0)       root group {0,0}: zero-contrast
                extensions f1 (r=1), f2 (r=0) from d1's turn 1 group {d1=0, 1, 0}: effective
                so d1 is effective (it owns a contrastive branch group), d2 wasted
Run r2 (strategy uniform), iteration 0: B: raw g1 (r=1), g2 (r=0): both effective.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from trace_core.home.shards import ShardWriter
from trace_core.nodes import nodes_frame, with_anchors

PROMPTS = {"A": ("math", 1), "B": ("qa", 2), "C": ("qa", 2), "D": ("fc", 3)}


def _root(run: str, it: int, prompt: str) -> dict:
    task, diff = PROMPTS[prompt]
    return dict(
        run_id=run, iteration=it, node_id=f"{run}/{it}/{prompt}", parent_id=None, prompt_id=prompt,
        trajectory_id=None, task=task, difficulty=diff, depth=0, origin="root", is_leaf=False, new_tokens=0,
    )


def _chain(run: str, it: int, prompt: str, traj: str, parent: str, depth0: int, turns: int, reward: float,
           origin: str) -> list[dict]:
    task, diff = PROMPTS[prompt]
    rows, prev = [], parent
    for d in range(depth0 + 1, depth0 + turns + 1):
        leaf = d == depth0 + turns
        nid = f"{run}/{it}/{traj}/{d}"
        rows.append(dict(
            run_id=run, iteration=it, node_id=nid, parent_id=prev, prompt_id=prompt, trajectory_id=traj,
            task=task, difficulty=diff, depth=d, origin=origin, is_leaf=leaf, new_tokens=10,
            reward=reward if leaf else None,
        ))
        prev = nid
    return rows


def raw(run, it, prompt, traj, turns, reward):
    return _chain(run, it, prompt, traj, f"{run}/{it}/{prompt}", 0, turns, reward, "raw")


def ext(run, it, prompt, traj, owner, at_depth, turns, reward):
    return _chain(run, it, prompt, traj, f"{run}/{it}/{owner}/{at_depth}", at_depth, turns, reward, "extension")


def fixture_nodes() -> dict[tuple[str, int, str], pl.DataFrame]:
    """(run, iteration, stage) -> nodes frame."""
    r1_0_raw = [_root("r1", 0, p) for p in "ABC"]
    r1_0_raw += raw("r1", 0, "A", "a1", 2, 1) + raw("r1", 0, "A", "a2", 2, 0)
    r1_0_raw += raw("r1", 0, "B", "b1", 1, 0) + raw("r1", 0, "B", "b2", 1, 0) + raw("r1", 0, "C", "c1", 1, 1)
    r1_0_ext = ext("r1", 0, "A", "e1", "a1", 1, 1, 1)
    r1_1_raw = [_root("r1", 1, p) for p in "AD"]
    r1_1_raw += raw("r1", 1, "A", "a3", 1, 1) + raw("r1", 1, "A", "a4", 1, 1)
    r1_1_raw += raw("r1", 1, "D", "d1", 2, 0) + raw("r1", 1, "D", "d2", 2, 0)
    r1_1_ext = ext("r1", 1, "D", "f1", "d1", 1, 1, 1) + ext("r1", 1, "D", "f2", "d1", 1, 1, 0)
    r2 = [_root("r2", 0, "B")] + raw("r2", 0, "B", "g1", 1, 1) + raw("r2", 0, "B", "g2", 1, 0)
    frames = {
        ("r1", 0, "raw_rollouts"): r1_0_raw,
        ("r1", 0, "extensions"): r1_0_ext,
        ("r1", 1, "raw_rollouts"): r1_1_raw,
        ("r1", 1, "extensions"): r1_1_ext,
        ("r2", 0, "raw_rollouts"): r2,
    }
    strategy = {"r1": "trace", "r2": "uniform"}
    out = {k: nodes_frame([{**r, "strategy": strategy[k[0]]} for r in rows]) for k, rows in frames.items()}
    # anchors come from the whole iteration (an extension's anchor lies in the raw rollouts' shard)
    whole = with_anchors(pl.concat([f.with_columns(pl.lit(i).alias("_k")) for i, f in enumerate(out.values())]))
    return {k: whole.filter(pl.col("_k") == i).drop("_k") for i, k in enumerate(out)}


def fixture_predictions() -> pl.DataFrame:
    return pl.DataFrame({
        "run_id": ["r1"] * 6,
        "iteration": [0] * 6,
        "node_id": [f"n{i}" for i in range(6)],
        "kind": ["root"] * 5 + ["prefix"],
        "v_pred": [0.05, 0.15, 0.12, 0.95, 1.0, 0.55],
        "outcome": [0.0, 0.5, 0.0, 1.0, 1.0, 1.0],
        "weight": [2.0, 2.0, 2.0, 1.0, 4.0, 1.0],
    })


def fixture_prompts() -> pl.DataFrame:
    return pl.DataFrame({
        "run_id": ["r1"] * 4,
        "strategy": ["trace"] * 4,
        "iteration": [0] * 4,
        "prompt_id": list("ABCD"),
        "task": ["math", "qa", "qa", "fc"],
        "v_pred": [0.5, 0.02, 0.9, 0.97],
        "m_alloc": [2, 2, 0, 3],
        "n_success": [1, 0, None, 2],  # B: sure to fail and did; D: sure to succeed, did not
        "n_total": [2, 2, None, 3],
    }, schema_overrides={"n_success": pl.Int32, "n_total": pl.Int32})


def fixture_iterations() -> pl.DataFrame:
    return pl.DataFrame({
        "run_id": ["r1", "r1"],
        "strategy": ["trace", "trace"],
        "iteration": [0, 1],
        "budget_asked": [6, 6],
        "budget_used": [6, 6],
        "tokens": [80, 80],
        "effective_ratio": [1 / 3, 1 / 3],
        "wasted_share": [2 / 3, 2 / 3],
        "accuracy": [0.4, 0.5],
        "accuracy_math": [0.5, 0.6],
        "loss": [0.1, 0.05],
        "timings": ['{"rollout": 1.5}', '{"rollout": 1.2}'],
    })


def build_fixture_store(home: Path) -> Path:
    for (run, it, stage), frame in fixture_nodes().items():
        ShardWriter(home, run).write("nodes", frame, iteration=it, stage=stage)
    w = ShardWriter(home, "r1", strategy="trace")
    w.write("predictions", fixture_predictions(), iteration=0, stage="predict")
    w.write("prompts", fixture_prompts(), iteration=0, stage="allocate_roots")
    it = fixture_iterations()
    for i in (0, 1):
        w.write("iterations", it.filter(pl.col("iteration") == i), iteration=i, stage="summary")
    return home
