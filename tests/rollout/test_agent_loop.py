"""The agent loop: raw rollouts and prefix extensions record correct, reproducible trees."""

from __future__ import annotations

import polars as pl
import pytest

from tests.tinypolicy import one_thread, spread_model, tiny_chat  # noqa: F401
from trace_core.engines.base import GenRequest, GenResult
from trace_core.engines.config import SamplingConfig
from trace_core.engines.hf import HFEngine
from trace_core.envs import make_env
from trace_core.envs.synthetic import demonstration, generate_tasks
from trace_core.nodes import NODE_SCHEMA, finalize_tree, node_id, root_rows, trajectories
from trace_core.policy.update import build_sequences
from trace_core.rollout.agent_loop import RolloutConfig, evaluate_rewards, extend_prefixes, run_rollouts

FAMILIES = ("math", "qa", "fc")


class ScriptedEngine:
    """Answers every request with the task's demonstration turn (found by prompt prefix)."""

    name = "scripted"

    def __init__(self, chat, scripts):
        self.chat, self.scripts, self.calls = chat, scripts, []

    def generate(self, requests, sampling):
        self.calls.append([(len(r.prompt_ids), r.n) for r in requests])
        out = []
        for r in requests:
            (prompt, actions), = [(p, a) for p, a in self.scripts.items() if tuple(r.prompt_ids[:len(p)]) == p]
            turn = self.chat.decode(r.prompt_ids[len(prompt):]).count("<|im_start|>assistant")
            ids = tuple(self.chat.encode(actions[turn]))
            out.append([GenResult(ids, self.chat.decode(ids), (-0.5,) * len(ids), "stop")] * r.n)
        return out

    def load_weights(self, checkpoint):  # pragma: no cover - protocol only
        pass


@pytest.fixture(scope="module")
def chat():
    return tiny_chat()


@pytest.fixture(scope="module")
def envs():
    # 'observe': a malformed turn shows an error and the episode goes on, so even a random
    # model plays several turns
    return {f: make_env(f, max_turns=3, on_malformed="observe") for f in FAMILIES}


def _tasks():
    return [t for f in FAMILIES for t in generate_tasks(f, 2, 1, seed=3)]


def test_scripted_demonstrations_reach_reward_one(chat, envs):
    tasks = _tasks()
    scripts = {tuple(chat.prompt_ids(envs[t.family].reset(t).messages())): demonstration(t) for t in tasks}
    eng = ScriptedEngine(chat, scripts)
    nodes = run_rollouts(eng, chat, {f: make_env(f) for f in FAMILIES}, tasks, [2] * len(tasks),
                         sampling=SamplingConfig(), run_id="r", iteration=1, seed=0)
    assert nodes.schema == pl.Schema(NODE_SCHEMA)
    leaves = nodes.filter(pl.col("is_leaf"))
    assert len(leaves) == 2 * len(tasks)
    assert leaves["reward"].to_list() == [1.0] * len(leaves), leaves["reward_reason"].to_list()
    roots = nodes.filter(pl.col("depth") == 0)
    assert roots["alloc_children"].to_list() == [2] * len(tasks)
    assert roots["subtree_mean_reward"].to_list() == [1.0] * len(tasks)
    # the m rollouts of a prompt share their first-turn context: one request with n = 2
    assert eng.calls[0] == [(len(p), 2) for p in scripts]
    for t in tasks:  # depth = number of demonstration turns
        assert nodes.filter(pl.col("prompt_id") == t.prompt_id)["depth"].max() == len(demonstration(t))


def test_random_model_runs_multi_turn_episodes_in_every_env(chat, envs):
    tasks = _tasks()
    eng = HFEngine(spread_model(seed=2), chat)
    s = SamplingConfig(max_new_tokens=12, seed=1)
    cfg = RolloutConfig(max_turns=3, progress=False)
    nodes = run_rollouts(eng, chat, envs, tasks, [3] * len(tasks), sampling=s, cfg=cfg, run_id="r", seed=7)
    for f in FAMILIES:
        fam = nodes.filter(pl.col("task") == f)
        assert fam["depth"].max() >= 2, f  # several turns were played
    turns = nodes.filter(pl.col("depth") > 0)
    assert (turns["new_tokens"] == turns["action_token_ids"].list.len()).all()
    assert (turns["new_tokens"] == turns["action_logprobs"].list.len()).all()
    leaves = nodes.filter(pl.col("is_leaf"))
    assert leaves["reward"].null_count() == 0 and leaves["reward_reason"].null_count() == 0
    assert len(trajectories(nodes)) == 3 * len(tasks)
    again = run_rollouts(eng, chat, envs, tasks, [3] * len(tasks), sampling=s, cfg=cfg, run_id="r", seed=7)
    assert again["node_id"].to_list() == nodes["node_id"].to_list()
    assert again["action_text"].to_list() == nodes["action_text"].to_list()
    # the training sequence of a trajectory is exactly ChatFormat.episode_ids of its turns
    msgs = {t.prompt_id: envs[t.family].reset(t).messages() for t in tasks}
    seqs = build_sequences(nodes.with_columns(advantage=pl.lit(1.0)), chat, msgs)
    rows = {r["node_id"]: r for r in nodes.iter_rows(named=True)}
    for traj, seq in zip(trajectories(nodes), seqs, strict=True):
        turns_ = [rows[n] for n in traj.path[1:]]
        obs = [t["observation_text"] for t in turns_ if t["observation_text"] is not None]
        ids, mask = chat.episode_ids(msgs[traj.prompt_id], [t["action_token_ids"] for t in turns_], obs)
        assert seq.input_ids == ids and seq.loss_mask == mask


def test_extensions_continue_from_a_replayed_prefix(chat, envs):
    tasks = _tasks()
    eng = HFEngine(spread_model(seed=2), chat)
    s = SamplingConfig(max_new_tokens=12, seed=1)
    cfg = RolloutConfig(max_turns=3, progress=False)
    nodes = run_rollouts(eng, chat, envs, tasks, [2] * len(tasks), sampling=s, cfg=cfg, seed=7)
    open_ = nodes.filter((pl.col("depth") == 1) & ~pl.col("is_leaf"))
    prefixes = {n: 3 for n in open_["node_id"].to_list()[:2]}
    by_prompt = {t.prompt_id: t for t in tasks}
    ext = extend_prefixes(eng, chat, envs, by_prompt, nodes, prefixes, sampling=s, cfg=cfg, seed=7)
    assert (ext["origin"] == "extension").all()
    first = ext.filter(pl.col("parent_id").is_in(list(prefixes)))
    assert sorted(first["parent_id"].value_counts()["count"].to_list()) == [3, 3]
    assert (first["depth"] == 2).all()
    assert ext["trajectory_id"].n_unique() == 6
    full = finalize_tree(pl.concat([nodes, ext]))
    pre = full.filter(pl.col("node_id").is_in(list(prefixes)))
    assert pre["subtree_count"].to_list() == [4, 4]  # the original continuation + 3 new ones
    again = extend_prefixes(eng, chat, envs, by_prompt, nodes, prefixes, sampling=s, cfg=cfg, seed=7)
    assert again["node_id"].to_list() == ext["node_id"].to_list()
    # extension sequences train only their own turns; the shared prefix is context
    msgs = {t.prompt_id: envs[t.family].reset(t).messages() for t in tasks}
    seqs = [q for q in build_sequences(full.with_columns(advantage=pl.lit(1.0)), chat, msgs)
            if q.trajectory_id in set(ext["trajectory_id"].to_list())]
    assert len(seqs) == 6
    plen = {pid: len(chat.prompt_ids(m)) for pid, m in msgs.items()}
    for q in seqs:
        assert sum(q.loss_mask[: min(plen.values())]) == 0
    with pytest.raises(ValueError, match="is a leaf"):
        leaf = nodes.filter(pl.col("is_leaf"))["node_id"][0]
        extend_prefixes(eng, chat, envs, by_prompt, nodes, {leaf: 2}, sampling=s, cfg=cfg)
    # from a root: fresh episodes of the prompt that join its raw group (adaptive groups)
    root = nodes.filter(pl.col("depth") == 0)["node_id"][0]
    grown = extend_prefixes(eng, chat, envs, by_prompt, nodes, {root: 2}, sampling=s, cfg=cfg, seed=3)
    starts = grown.filter(pl.col("parent_id") == root)
    assert (grown["origin"] == "raw").all() and starts.height == 2 and (starts["depth"] == 1).all()
    tree = finalize_tree(pl.concat([nodes, grown]))
    n_raw = int(nodes.filter(pl.col("parent_id") == root).height)
    assert tree.filter(pl.col("node_id") == root)["subtree_count"].item() == n_raw + 2


def test_context_limit_ends_episodes(chat, envs):
    tasks = _tasks()[:1]
    eng = HFEngine(spread_model(seed=2), chat)
    plen = len(chat.prompt_ids(envs["math"].reset(tasks[0]).messages()))
    cfg = RolloutConfig(max_turns=8, max_context_tokens=plen + 30, progress=False)
    nodes = run_rollouts(eng, chat, envs, tasks, [2], sampling=SamplingConfig(max_new_tokens=12), cfg=cfg)
    reasons = set(nodes.filter(pl.col("is_leaf"))["reward_reason"].to_list())
    assert reasons <= {"context_limit", "turn_limit", "no_action", "wrong_answer", "correct", "malformed_json",
                       "malformed_call", "unknown_tool", "bad_arguments", "tool_error", "empty_answer",
                       "unparsable_answer", "token_limit"}
    assert nodes["depth"].max() <= 3


def test_root_rows_head_the_rollout_trees(chat, envs):
    tasks = _tasks()
    eng = HFEngine(spread_model(seed=2), chat)
    counts, v = [2, 0, 3, 1, 0, 2], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    nodes = run_rollouts(eng, chat, envs, tasks, counts, sampling=SamplingConfig(max_new_tokens=8, seed=1),
                         cfg=RolloutConfig(max_turns=2, progress=False), run_id="r", iteration=3, strategy="s",
                         v_pred=v, seed=7)
    chosen = [i for i, m in enumerate(counts) if m]
    want = root_rows("r", 3, "s", [tasks[i] for i in chosen], counts=[counts[i] for i in chosen],
                     v_pred=[v[i] for i in chosen])
    got = nodes.filter(pl.col("origin") == "root")
    assert got.drop("created_at", "subtree_mean_reward", "subtree_count").equals(
        want.drop("created_at", "subtree_mean_reward", "subtree_count"))
    assert got["action_text"].to_list() == [tasks[i].question for i in chosen]  # what the predictor reads
    assert got["node_id"].to_list() == [node_id("r", 3, tasks[i].prompt_id, "root") for i in chosen]
    pool = root_rows("r", 3, "s", tasks)  # the candidate pool before allocation: no decision yet
    assert pool.schema == pl.Schema(NODE_SCHEMA) and pool["alloc_children"].null_count() == len(tasks)
    with pytest.raises(ValueError, match="counts"):
        root_rows("r", 3, "s", tasks, counts=[1])


def test_evaluate_rewards_plays_the_rollout_episodes(chat, envs):
    tasks = _tasks()
    eng = HFEngine(spread_model(seed=2), chat)
    s, cfg = SamplingConfig(max_new_tokens=12, seed=1), RolloutConfig(max_turns=3, progress=False)
    rewards = evaluate_rewards(eng, chat, envs, tasks, 3, sampling=s, cfg=cfg, seed=7)
    assert rewards.shape == (len(tasks), 3)
    nodes = run_rollouts(eng, chat, envs, tasks, [3] * len(tasks), sampling=s, cfg=cfg, run_id="r", seed=7)
    leaf = {r["trajectory_id"]: r["reward"] for r in nodes.filter(pl.col("is_leaf")).iter_rows(named=True)}
    want = [[leaf[node_id("r", 0, t.prompt_id, f"r{j}")] for j in range(3)] for t in tasks]
    assert rewards.tolist() == want  # row i = tasks[i], column j = rollout j: the same episodes
    assert evaluate_rewards(eng, chat, envs, [], 2, sampling=s, cfg=cfg).shape == (0, 2)


def test_engine_request_shape(chat):
    r = GenRequest((1, 2, 3), n=2, seed=4)
    assert r.n == 2 and r.prompt_ids == (1, 2, 3)


@pytest.mark.slow
def test_shipped_warm_policy_plays_multi_turn_episodes():
    from trace_core.policy.model import TINY_WARM_DIR, load_policy

    if not (TINY_WARM_DIR / "config.json").is_file():
        pytest.skip("shipped tiny-warm checkpoint not built (trace-rl warmup)")
    from trace_core.policy.chat import ChatFormat

    model, tok = load_policy()
    chat = ChatFormat(tok)
    envs = {f: make_env(f) for f in FAMILIES}
    tasks = [t for f in FAMILIES for t in generate_tasks(f, 4, 0, seed=11)]
    nodes = run_rollouts(HFEngine(model, chat), chat, envs, tasks, [4] * len(tasks),
                         sampling=SamplingConfig(max_new_tokens=64, seed=0), cfg=RolloutConfig(progress=False))
    leaves = nodes.filter(pl.col("is_leaf"))
    for f in FAMILIES:
        fam = nodes.filter(pl.col("task") == f)
        assert fam["depth"].max() >= 2, f  # the warm policy calls tools before answering
    assert leaves["reward"].sum() > 0  # and solves some episodes


def test_request_seeds_differ_across_prompts():
    """Rollout j of two prompts must not share a random stream (the seed keys on the prompt)."""
    from trace_core.rollout.agent_loop import _request_seed

    a, b = _request_seed(7, "p1", "r0", 0), _request_seed(7, "p2", "r0", 0)
    assert a != b and a == _request_seed(7, "p1", "r0", 0)
    assert _request_seed(7, "p1", "r0", 1) != a and _request_seed(8, "p1", "r0", 0) != a


def test_one_rollouts_interface_local_and_ray_alike():
    """The runtime picks the implementation once from the config; local and Ray take the
    same typed calls, and only the flow's process (with workers) holds hf instead of run.engine."""
    import inspect
    from pathlib import Path

    from trace_core.config import load_train_config
    from trace_core.engines.pool import RolloutPool
    from trace_core.rollout.interface import Rollouts
    from trace_core.rollout.local import LocalRollouts
    from trace_core.runtime import Runtime

    for name in ("raw", "extend", "evaluate"):
        want = inspect.signature(getattr(Rollouts, name))
        assert inspect.signature(getattr(LocalRollouts, name)) == want, name
        assert inspect.signature(getattr(RolloutPool, name)) == want, name
    configs = Path(__file__).resolve().parents[2] / "configs"
    cfg = load_train_config(configs / "small-ci.yaml", ["run.threads=1"])
    local = Runtime(cfg).rollouts
    assert isinstance(local, LocalRollouts) and (local.engine, local.threads) == (cfg.run.engine, 1)
    assert cfg.run.flow_engine == cfg.run.engine
    pooled = load_train_config(configs / "small-ci.yaml", ["run.engine=vllm", "run.rollout_workers=2"])
    assert (pooled.run.flow_engine, pooled.run.engine) == ("hf", "vllm")


def test_local_rollouts_are_the_agent_loop_on_the_live_policy():
    """``LocalRollouts.raw`` / ``evaluate`` on a checkpoint = ``run_rollouts`` / ``evaluate_rewards``
    on that checkpoint's live policy (the same node table, the same rewards)."""
    from pathlib import Path

    from node_digest import node_digest

    from trace_core.config import load_train_config
    from trace_core.policy.model import TINY_WARM_DIR
    from trace_core.runtime import Runtime
    from trace_core.stages.run import initial_checkpoint

    if not (TINY_WARM_DIR / "config.json").is_file():
        pytest.skip("shipped tiny-warm checkpoint not built (trace-rl warmup)")
    cfg = load_train_config(Path(__file__).resolve().parents[2] / "configs" / "small-ci.yaml",
                            ["run.threads=1", "sampling.max_new_tokens=12"])
    rt = Runtime(cfg)
    ro, ck = rt.rollouts, initial_checkpoint(cfg)
    tasks = [t for f in FAMILIES for t in generate_tasks(f, 1, 0, seed=5)]
    kw = {"sampling": cfg.sampling, "cfg": RolloutConfig(max_turns=2, progress=False), "seed": 3}
    nodes = ro.raw(ck, tasks, [2] * len(tasks), run_id="r", iteration=0, **kw)
    pol = rt.live.get(ck, engine=cfg.run.engine)
    assert pol.engine.name == cfg.run.engine
    again = run_rollouts(pol.engine, pol.chat, ro.envs, tasks, [2] * len(tasks), run_id="r", iteration=0, **kw)
    assert node_digest(nodes) == node_digest(again)
    rewards = ro.evaluate(ck, tasks, 2, **kw)
    assert rewards.shape == (len(tasks), 2)
    assert (rewards == evaluate_rewards(pol.engine, pol.chat, ro.envs, tasks, 2, **kw)).all()
