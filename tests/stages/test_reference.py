"""The reference score's parts that need no policy: the within-cell rank and the history join."""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.envs.base import Task
from trace_core.home.shards import ShardWriter
from trace_core.nodes import root_rows
from trace_core.stages.reference import demo_logprobs, with_reference_scores, within_cell_rank
from trace_core.stages.run import RunRef


def _task(pid: str, family: str, difficulty: int) -> Task:
    return Task(prompt_id=pid, family=family, difficulty=difficulty, question=f"q {pid}", payload={})


def test_within_cell_rank_scales_ranks_to_half_units_per_cell():
    tasks = [_task("a", "qa", 0), _task("b", "qa", 0), _task("c", "qa", 0), _task("d", "qa", 1),
             _task("e", "math", 0), _task("f", "math", 0), _task("g", "math", 0)]
    v = np.array([-3.0, -1.0, -2.0, -5.0, -1.0, -1.0, np.nan])
    r = within_cell_rank(tasks, v)
    assert r[:3].tolist() == [-0.5, 0.5, 0.0]  # ranked inside (qa, 0)
    assert r[3] == 0.0  # a lone candidate of its cell
    assert r[4] == r[5] == 0.0  # ties share the mean rank
    assert np.isnan(r[6])  # no score, no rank


def test_demo_logprobs_leave_a_task_without_a_demonstration_unscored():
    from tests.tinypolicy import tiny_chat, tiny_model

    chat = tiny_chat()
    ids = chat.encode("What is 12 * 7 + 3? <answer>87</answer>")
    mask = [0] * 6 + [1] * (len(ids) - 6)
    lp = demo_logprobs(tiny_model(), [(ids, mask), None, (ids, mask)], chat.pad_token_id)
    assert np.isnan(lp[1]) and np.isfinite(lp[[0, 2]]).all() and (lp[[0, 2]] < 0).all()
    assert np.isclose(lp[0], lp[2], atol=1e-5), "padding in a batch changes nothing"


def test_history_roots_get_the_score_stage_2_recorded(tmp_path):
    ref = RunRef(str(tmp_path), "r1")
    tasks = [_task("p1", "qa", 0), _task("p2", "qa", 0)]
    writer = ShardWriter(ref.home, ref.run_id, strategy="trace")
    for i, scores in enumerate(([0.5, -0.5], [None, 0.25])):
        writer.write("prompts", pl.DataFrame({"iteration": i, "prompt_id": ["p1", "p2"], "task": "qa", "difficulty": 0,
                                              "v_pred": 0.5, "m_alloc": 2, "ref_score": scores}),
                     stage="final", iteration=i)
    nodes = pl.concat([root_rows(ref.run_id, i, "trace", tasks) for i in range(3)], how="vertical_relaxed")
    child = nodes.head(1).with_columns(pl.lit(1, dtype=nodes["depth"].dtype).alias("depth"),
                                       pl.lit("n-child").alias("node_id"))
    out = with_reference_scores(pl.concat([nodes, child]), ref, before=3)
    got = {(r["iteration"], r["prompt_id"], r["depth"]): r["ref_score"] for r in out.iter_rows(named=True)}
    assert got[(0, "p1", 0)] == 0.5 and got[(0, "p2", 0)] == -0.5 and got[(1, "p2", 0)] == 0.25
    assert got[(1, "p1", 0)] is None and got[(2, "p1", 0)] is None  # not scored / no shard yet
    assert got[(0, "p1", 1)] is None  # only roots carry it
