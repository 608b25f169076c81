"""Rollout trajectories as MLflow 3 traces, so that a run's page in the MLflow UI shows what the
agent did: one trace per sampled trajectory (``tracking.trace_samples`` per iteration), a span
per agent turn on its path from the prompt (the action as input, the tool's observation as
output; turns a continuation shares with the raw trajectory it branched from are marked), the
verifier's reward and reason as the trace's assessment (feedback ``reward``), and the predicted
success V and the allocation decided at each node as attributes. The sample is drawn with the
run's seed, so a resumed run would pick the same trajectories."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from trace_core.home.shards import read_shard

TOOL_CALL = "<tool_call>"


def _path(by_id: dict[str, dict], leaf: dict) -> list[dict]:
    out, node = [], leaf
    while node is not None:
        out.append(node)
        node = by_id.get(node["parent_id"]) if node["parent_id"] is not None else None
    return out[::-1]


def trajectory_traces(nodes: pl.DataFrame, cap: int, seed: int) -> list[dict[str, Any]]:
    """JSON-able specs of up to ``cap`` traces of the trajectories in one iteration's ``nodes``."""
    leaves = nodes.filter(pl.col("is_leaf") & pl.col("trajectory_id").is_not_null()).sort("trajectory_id")
    if cap <= 0 or leaves.height == 0:
        return []
    pick = np.sort(np.random.default_rng(seed).choice(leaves.height, size=min(cap, leaves.height), replace=False))
    by_id = {r["node_id"]: r for r in nodes.to_dicts()}
    specs = []
    for leaf in leaves[pick.tolist()].to_dicts():
        path = _path(by_id, leaf)
        root, turns = path[0], path[1:]
        specs.append({
            "name": f"{leaf['prompt_id']} · {leaf['trajectory_id']}",
            "question": root.get("action_text") or "",
            "attributes": {"run_id": leaf["run_id"], "iteration": leaf["iteration"], "prompt_id": leaf["prompt_id"],
                           "task": leaf["task"], "difficulty": leaf["difficulty"], "origin": leaf["origin"],
                           "trajectory_id": leaf["trajectory_id"], "root_v_pred": root.get("v_pred"),
                           "root_alloc_m": root.get("alloc_children")},
            "turns": [{"name": f"turn {t['depth']}" + ("" if t["trajectory_id"] == leaf["trajectory_id"] else " (prefix)"),
                       "tool": TOOL_CALL in (t["action_text"] or ""),
                       "action": t["action_text"] or "", "observation": t["observation_text"] or "",
                       "attributes": {"depth": t["depth"], "origin": t["origin"], "new_tokens": t["new_tokens"],
                                      "tool_errors": t["tool_errors"], "v_pred": t["v_pred"],
                                      "alloc_children": t["alloc_children"], "utility": t["utility"],
                                      "shared_prefix": t["trajectory_id"] != leaf["trajectory_id"]}}
                      for t in turns],
            "reward": leaf["reward"], "reason": leaf.get("reward_reason"),
        })
    return specs


def _clean(attrs: dict) -> dict:
    return {k: v for k, v in attrs.items() if v is not None}


def send_traces(tracking_uri: str, run_id: str, experiment_id: str, op: dict[str, Any]) -> list[str]:
    """Log the traces of ``op`` (``Tracker.log_traces``) in the run's experiment, linked to the run;
    returns their trace ids."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import AssessmentSource, SpanType


    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    ids = []
    for spec in trajectory_traces(read_shard(op["nodes"]), op["cap"], op["seed"]):
        root = client.start_trace(name=spec["name"], span_type=SpanType.AGENT, inputs={"question": spec["question"]},
                                  attributes=_clean(spec["attributes"]), experiment_id=experiment_id, run_id=run_id,
                                  tags={"trace_rl.iteration": str(spec["attributes"]["iteration"])})
        for turn in spec["turns"]:
            span = client.start_span(turn["name"], trace_id=root.trace_id, parent_id=root.span_id,
                                     span_type=SpanType.TOOL if turn["tool"] else SpanType.LLM,
                                     inputs={"action": turn["action"]}, attributes=_clean(turn["attributes"]))
            client.end_span(root.trace_id, span.span_id, outputs={"observation": turn["observation"]})
        client.end_trace(root.trace_id, outputs={"reward": spec["reward"], "reason": spec["reason"]})
        ids.append((root.trace_id, spec))
    mlflow.flush_trace_async_logging()  # traces are exported in the background: stored before their assessments
    for trace_id, spec in ids:
        if spec["reward"] is not None:
            mlflow.log_feedback(trace_id=trace_id, name="reward", value=float(spec["reward"]),
                                rationale=spec["reason"], source=AssessmentSource(source_type="CODE", source_id="verifier"))
    return [trace_id for trace_id, _ in ids]
