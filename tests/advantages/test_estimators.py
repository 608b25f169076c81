"""Advantage estimators on hand-computed trees."""

from __future__ import annotations

import numpy as np
import pytest

from trace_core.advantages.config import AdvantageConfig
from trace_core.advantages.estimators import compute_advantages, get_adv_est, register_adv_est
from trace_core.config import TrainConfig
from trace_core.config.io import ConfigError
from trace_core.nodes import nodes_frame
from trace_core.runtime import check_names


def _node(nid, parent, reward=None, leaf=False, prompt="p"):
    return {"node_id": nid, "parent_id": parent, "prompt_id": prompt, "is_leaf": leaf, "reward": reward,
            "depth": 0 if parent is None else 1}


def branched():
    """R has raw rollouts a1-a2-a3 (r=0) and b1 (r=1); prefix a1 was extended by e1 (r=1) and
    f1-f2 (r=1). Leaves below R: 0,1,1,1 (mean 3/4); below a1: 0,1,1 (mean 2/3)."""
    return nodes_frame([
        _node("R", None), _node("a1", "R"), _node("a2", "a1"), _node("a3", "a2", 0.0, True),
        _node("b1", "R", 1.0, True), _node("e1", "a1", 1.0, True), _node("f1", "a1"), _node("f2", "f1", 1.0, True),
    ])


def adv(nodes, **kw):
    out = compute_advantages(nodes, AdvantageConfig(**kw))
    return dict(zip(out["node_id"], out["advantage"], strict=True))


def test_tree_advantage_by_hand():
    a = adv(branched(), estimator="tree")
    assert a["R"] is None
    expect = {"a1": 2 / 3 - 3 / 4, "a2": -2 / 3, "a3": -2 / 3, "b1": 1 / 4, "e1": 1 / 3, "f1": 1 / 3, "f2": 1 / 3}
    for k, v in expect.items():
        assert a[k] == pytest.approx(v, abs=1e-6), k


def test_grpo_advantage_on_branched_tree_uses_the_prompt_group():
    a = adv(branched(), estimator="grpo")
    expect = {"a1": 2 / 3 - 3 / 4, "a2": -3 / 4, "a3": -3 / 4, "b1": 1 / 4, "e1": 1 / 4, "f1": 1 / 4, "f2": 1 / 4}
    for k, v in expect.items():
        assert a[k] == pytest.approx(v, abs=1e-6), k


def test_tree_std_scaling_uses_the_anchor_group():
    a = adv(branched(), estimator="tree", scale_std=True)
    assert a["a2"] == pytest.approx((-2 / 3) / np.sqrt(2 / 9), abs=1e-4)
    assert a["b1"] == pytest.approx(0.25 / np.sqrt(3 / 16), abs=1e-4)


def chains():
    """Prompt p: 4 two-turn rollouts with rewards 1,0,0,1; prompt q: one rollout (no group)."""
    rows = [_node("P", None)]
    for j, r in enumerate([1.0, 0.0, 0.0, 1.0]):
        rows += [_node(f"t{j}", "P"), _node(f"u{j}", f"t{j}", r, True)]
    rows += [_node("Q", None, prompt="q"), _node("v", "Q", prompt="q"), _node("w", "v", 1.0, True, prompt="q")]
    return nodes_frame(rows)


@pytest.mark.parametrize("scale", [False, True])
def test_without_branches_tree_equals_grpo(scale):
    t, g = adv(chains(), estimator="tree", scale_std=scale), adv(chains(), estimator="grpo", scale_std=scale)
    assert t == pytest.approx(g)
    mag = 1.0 if scale else 0.5
    for j, r in enumerate([1, 0, 0, 1]):
        sign = 1 if r else -1
        assert t[f"t{j}"] == pytest.approx(sign * mag, abs=1e-4)
        assert t[f"u{j}"] == pytest.approx(sign * mag, abs=1e-4)
    assert t["v"] == t["w"] == 0.0  # a prompt sampled once has nothing to contrast with


def test_all_equal_group_gets_zero():
    rows = [_node("P", None)] + [_node(f"l{j}", "P", 1.0, True) for j in range(3)]
    a = adv(nodes_frame(rows), estimator="tree", scale_std=True)
    assert all(a[f"l{j}"] == 0.0 for j in range(3))


def test_registry_rejects_duplicates_and_lists_known():
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(lambda nodes, stats, cfg: np.zeros(len(nodes)))
    with pytest.raises(KeyError, match="known: grpo, tree"):
        get_adv_est("nope")


def test_unknown_estimator_is_rejected_at_start():
    cfg = TrainConfig(advantage=AdvantageConfig(estimator="nope"))  # a config is plain data
    with pytest.raises(ConfigError, match="advantage.estimator: unknown advantage estimator 'nope'; known: grpo, tree"):
        check_names(cfg)


def _random_trees(seed: int, graded: bool) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(6):
        rows.append(_node(f"p{p}", None, prompt=f"p{p}"))
        open_ = [f"p{p}"]
        for k in range(int(rng.integers(1, 20))):
            nid, leaf = f"p{p}.{k}", bool(rng.random() < 0.45)
            r = (float(rng.random()) if graded else float(rng.integers(2))) if leaf and rng.random() > 0.1 else None
            rows.append(_node(nid, open_[int(rng.integers(len(open_)))], r, leaf, prompt=f"p{p}"))
            if not leaf:
                open_.append(nid)
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_subtree_stats_match_brute_force(seed):
    from trace_core.nodes import finalize_tree, path_to_root, subtree_stats

    rows = _random_trees(seed, graded=seed % 2 == 1)
    nodes = nodes_frame(rows)
    st = subtree_stats(nodes)
    parent = {r["node_id"]: r["parent_id"] for r in rows}
    below: dict[str, list[float]] = {r["node_id"]: [] for r in rows}
    for r in rows:
        if r["is_leaf"] and r["reward"] is not None:
            for a in path_to_root(r["node_id"], parent):
                below[a].append(r["reward"])
    for k, r in enumerate(rows):
        got = below[r["node_id"]]
        assert st.count[k] == len(got)
        assert st.children[k] == sum(p == r["node_id"] for p in parent.values())
        if got:
            assert st.mean[k] == pytest.approx(np.mean(got)) and st.std[k] == pytest.approx(np.std(got), abs=1e-7)
        else:
            assert np.isnan(st.mean[k]) and np.isnan(st.std[k])
    # compute_advantages fills the subtree columns itself, exactly as finalize_tree does
    out, fin = compute_advantages(nodes), finalize_tree(nodes)
    for col in ("subtree_mean_reward", "subtree_count"):
        assert out[col].to_list() == fin[col].to_list()
