"""Oracle simulator: every strategy at equal budget on synthetic multi-turn trees with known V_t.

Model. A prompt has a latent difficulty; its initial success probability is
``p_0 = sigmoid(z)`` with ``z`` drawn from a mixture of normals on the logit scale (the
*difficulty mix*). Each agent turn moves the conditional success probability as a bounded
martingale ``p_{t+1} = p_t + step * p_t (1 - p_t) * eps``, ``eps = +-1`` with equal chance: it
stays in [0, 1], ``E[p_{t+1} | p_t] = p_t``, and it drifts toward 0 or 1 as turns pass. After the
last turn the reward is Bernoulli(``p_T``), so ``p_t`` is the true V_t of the prefix after turn t.
A continuation from a prefix replays the remaining turns with fresh randomness.

Predictors see the truth through logit noise: ``v_pred = sigmoid(logit(p) + N(0, noise^2))``,
``root_noise`` for prompts (p_0), ``prefix_noise`` for prefixes (V_t).

One iteration of a strategy: a candidate pool of ``pool_factor * budget / group_size`` prompts
(the same stream for every strategy) -> root allocation -> raw rollouts -> open prefixes (turns
1..T-1 of every raw rollout) -> prefix allocation with what the roots left of the budget ->
continuations. Groups: a prompt's raw rollouts; a branched prefix's raw rollout plus its
continuations. Metrics come from ``trace_core.metrics`` on the membership rows.

``run_simulation(cfg)`` returns one row per strategy (and the coverage comparison rows) with
means and 95% confidence half-widths over seeds; ``format_table`` prints it.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy import stats

from trace_core import metrics
from trace_core.allocation import strategy_names
from trace_core.allocation.config import AllocationConfig
from trace_core.allocation.planner import plan_prefixes, plan_roots

ALL_STRATEGIES = ["grpo", "dapo", "pcl", "treepo", "trace-root", "trace-prefix", "trace"]
METRICS = ["effective_ratio", "wasted_share", "eff_per_1k_tokens", "grad_energy"]


class MixComponent(BaseModel):
    """One component of the difficulty mix: a normal on the logit of p_0."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(..., gt=0.0, description="Relative weight (weights are normalised).")
    mean: float = Field(..., ge=-20.0, le=20.0, description="Mean of logit(p_0).")
    sd: float = Field(..., ge=0.0, le=20.0, description="Standard deviation of logit(p_0).")


def _default_mix() -> list[MixComponent]:
    # Many prompts far too hard or too easy, a learnable middle: calibrated once so that GRPO
    # (uniform, n=8) has an expected effective ratio near 27%.
    # Per component E[V_root(p, 8)] is 0.114 (logit -5 or +5, sd 1.5) and 0.820 (logit 0, sd 1.5).
    return [MixComponent(weight=0.50, mean=-5.0, sd=1.5), MixComponent(weight=0.22, mean=0.0, sd=1.5),
            MixComponent(weight=0.28, mean=5.0, sd=1.5)]


class SimulateConfig(BaseModel):
    """Oracle simulator run: model, predictor noise, budget, strategies, seeds."""

    model_config = ConfigDict(extra="forbid")

    strategies: list[str] = Field(default_factory=lambda: list(ALL_STRATEGIES),
                                  description="Registered strategies to compare at equal budget.")
    allocation: AllocationConfig = Field(
        default_factory=lambda: AllocationConfig(budget_total=1024),
        description="Budget shared by all strategies and each one's own section (its 'strategy' field is ignored).",
    )
    coverage_rows: bool = Field(
        True, description="Add the fixed-budget comparison: broad (B/2 prompts x 2 rollouts) vs deep "
        "(B/6 prompts x 2 rollouts + 4 prefix continuations each), both chosen by TRACE.")
    pool_factor: float = Field(8.0, ge=1.0, le=1000.0,
                               description="Candidate pool = pool_factor * budget_total / group_size prompts.")
    turns: int = Field(5, ge=2, le=64, description="Agent turns per episode (T).")
    step: float = Field(0.6, gt=0.0, le=1.0, description="Martingale step: p += step * p(1-p) * (+-1).")
    tokens_per_turn: int = Field(128, ge=1, le=100_000, description="Generated tokens per turn.")
    root_noise: float = Field(1.0, ge=0.0, le=10.0, description="Logit noise sd of the prompt predictor.")
    prefix_noise: float = Field(0.5, ge=0.0, le=10.0, description="Logit noise sd of the prefix predictor.")
    difficulty_mix: list[MixComponent] = Field(default_factory=_default_mix, min_length=1,
                                               description="Mixture of normals on logit(p_0).")
    iterations: int = Field(10, ge=1, le=10_000, description="Iterations per seed.")
    seeds: int = Field(8, ge=2, le=1000, description="Independent seeds (confidence intervals over them).")
    seed: int = Field(0, ge=0, description="Base seed.")

    @model_validator(mode="after")
    def _known(self) -> SimulateConfig:
        unknown = [s for s in self.strategies if s not in strategy_names()]
        if unknown:
            raise ValueError(f"unknown strategies {unknown}; known: {', '.join(strategy_names())}")
        return self

    @property
    def pool_size(self) -> int:
        a = self.allocation
        return max(1, int(round(self.pool_factor * a.budget_total / a.group_size)))


# ----------------------------------------------------------------------------- world model
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _noisy(p: np.ndarray, sd: float, rng: np.random.Generator) -> np.ndarray:
    z = np.log(np.clip(p, 1e-6, 1 - 1e-6)) - np.log1p(-np.clip(p, 1e-6, 1 - 1e-6))
    return _sigmoid(z + sd * rng.standard_normal(p.shape))


def sample_difficulty(cfg: SimulateConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) initial success probabilities p_0 from the difficulty mix."""
    w = np.array([c.weight for c in cfg.difficulty_mix])
    comp = rng.choice(len(w), size=n, p=w / w.sum())
    mean = np.array([c.mean for c in cfg.difficulty_mix])[comp]
    sd = np.array([c.sd for c in cfg.difficulty_mix])[comp]
    return _sigmoid(mean + sd * rng.standard_normal(n))


def walk(p: np.ndarray, steps: np.ndarray, step: float, rng: np.random.Generator) -> np.ndarray:
    """Run the martingale from ``p`` (R,) for ``steps`` (R,) turns; returns (R, max_steps + 1) paths
    (a row stays put after its own last step)."""
    n_max = int(steps.max()) if steps.size else 0
    out = np.empty((p.shape[0], n_max + 1))
    out[:, 0] = p
    cur = p.copy()
    for t in range(n_max):
        eps = rng.choice([-1.0, 1.0], size=p.shape[0])
        moved = cur + step * cur * (1.0 - cur) * eps
        cur = np.where(t < steps, moved, cur)
        out[:, t + 1] = cur
    return out


# ----------------------------------------------------------------------------- one iteration
def run_iteration(cfg: SimulateConfig, alloc: AllocationConfig, strategy: str, p0: np.ndarray,
                  v_root: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    """Spend one iteration's budget with ``strategy`` on the candidate pool; returns metrics."""
    T, tok = cfg.turns, cfg.tokens_per_turn
    alloc = alloc.model_copy(update={"strategy": strategy})
    roots = plan_roots(v_root, alloc, rng)  # the training flow's planner, on oracle-noised values
    m = roots.m
    prompt = np.repeat(np.arange(p0.shape[0]), m)
    R = prompt.shape[0]
    paths = walk(p0[prompt], np.full(R, T), cfg.step, rng)
    reward = (rng.random(R) < paths[:, T]).astype(float)
    # open prefixes: state after turn t = 1..T-1 of every raw rollout
    traj = np.repeat(np.arange(R), T - 1)
    depth = np.tile(np.arange(1, T), R)
    v_true = paths[traj, depth]
    v_pred = _noisy(v_true, cfg.prefix_noise, rng)
    wins = np.bincount(prompt, weights=reward, minlength=p0.shape[0])
    flat = (m > 0) & ((wins == 0) | (wins == m))  # all-fail / all-success root groups
    plan = plan_prefixes(roots, v_root, v_pred, reward[traj], depth, T - depth, R, alloc, rng,
                         zero_variance_groups=int(flat.sum()), zero_variance_trajectories=int(m[flat].sum()))
    k, m2 = plan.k, plan.second_wave
    node = np.repeat(np.arange(traj.shape[0]), k)
    n_ext = node.shape[0]
    cont = walk(v_true[node], T - depth[node], cfg.step, rng)
    cont_reward = (rng.random(n_ext) < cont[:, -1]).astype(float)
    # membership rows: root groups, then prefix groups (the raw rollout + its continuations)
    branched = np.flatnonzero(k > 0)
    n_groups = p0.shape[0]
    group = np.concatenate([prompt, n_groups + branched, n_groups + node])
    t_id = np.concatenate([np.arange(R), traj[branched], R + np.arange(n_ext)])
    rew = np.concatenate([reward, reward[traj[branched]], cont_reward])
    tokens = np.concatenate([np.full(R, T * tok), np.full(branched.size, T * tok), (T - depth[node]) * tok])
    prompt2 = np.repeat(np.arange(p0.shape[0]), m2)
    if prompt2.size:
        reward2 = (rng.random(prompt2.size) < walk(p0[prompt2], np.full(prompt2.size, T), cfg.step, rng)[:, T])
        group = np.concatenate([group, prompt2])
        t_id = np.concatenate([t_id, R + n_ext + np.arange(prompt2.size)])
        rew = np.concatenate([rew, reward2.astype(float)])
        tokens = np.concatenate([tokens, np.full(prompt2.size, T * tok)])
    if group.size == 0:
        return {"effective_ratio": 0.0, "wasted_share": 0.0, "eff_per_1k_tokens": 0.0, "grad_energy": 0.0,
                "prompts": 0.0, "signal_prompts": 0.0, "trajectories": 0.0, "continuations": 0.0}
    _, eff = metrics.effective_mask(group, rew, t_id)  # indexed by trajectory id 0..R+n_ext-1
    prompt_of = np.concatenate([prompt, prompt[traj[node]], prompt2])
    n_traj = R + n_ext + prompt2.size
    return {
        "effective_ratio": float(eff.mean()),
        "wasted_share": metrics.wasted_trajectories(group, rew, t_id) / n_traj,
        "eff_per_1k_tokens": metrics.effective_per_1k_tokens(group, rew, tokens, t_id),
        "grad_energy": metrics.gradient_energy(group, rew, t_id),
        "prompts": float((m + m2 > 0).sum()),
        "signal_prompts": float(np.unique(prompt_of[eff]).size),  # prompts that feed the gradient
        "trajectories": float(n_traj),
        "continuations": float(n_ext),
    }


# ----------------------------------------------------------------------------- runs and table
def _variants(cfg: SimulateConfig) -> list[tuple[str, str, AllocationConfig]]:
    """(row label, strategy, allocation config) for every row of the table."""
    a = cfg.allocation
    rows = [(s, s, a.model_copy(update={"strategy": s})) for s in cfg.strategies]
    if cfg.coverage_rows:
        B = a.budget_total
        rows.append((f"broad: {B // 2} prompts x 2", "trace",
                     a.with_knobs("trace", root_share=1.0, max_per_prompt=2, min_active=2)))
        rows.append((f"deep: {B // 6} prompts x (2 + 4 ext)", "trace",
                     a.with_knobs("trace", root_share=1.0 / 3.0, max_per_prompt=2, min_active=2)))
    return rows


def run_simulation(cfg: SimulateConfig) -> pl.DataFrame:
    """Every strategy (and coverage variant) over ``iterations`` x ``seeds`` at equal budget.

    Returns one row per variant: ``strategy``, for each metric its mean over seeds and
    ``<metric>_ci`` (95% t-interval half-width over the per-seed means), plus mean prompts,
    prompts with signal (at least one effective trajectory), trajectories and continuations per
    iteration.
    """
    variants = _variants(cfg)
    per_seed = {label: [] for label, _, _ in variants}
    for s in range(cfg.seeds):
        for it in range(cfg.iterations):
            world = np.random.default_rng([cfg.seed, s, it, 0])
            p0 = sample_difficulty(cfg, cfg.pool_size, world)
            v_root = _noisy(p0, cfg.root_noise, world)  # the same predictions for every strategy
            for vi, (label, strat, alloc) in enumerate(variants):
                rng = np.random.default_rng([cfg.seed, s, it, 1, vi])
                res = run_iteration(cfg, alloc, strat, p0, v_root, rng)
                if it == 0:
                    per_seed[label].append({k: 0.0 for k in res})
                acc = per_seed[label][s]
                for k, val in res.items():
                    acc[k] += val / cfg.iterations
    return _summarise(per_seed)


def _summarise(per_seed: dict[str, list[dict[str, float]]]) -> pl.DataFrame:
    rows = []
    for label, seeds in per_seed.items():
        n = len(seeds)
        t = stats.t.ppf(0.975, n - 1) if n > 1 else float("nan")
        row: dict[str, float | str] = {"strategy": label}
        for key in [*METRICS, "prompts", "signal_prompts", "trajectories", "continuations"]:
            x = np.array([d[key] for d in seeds])
            row[key] = float(x.mean())
            if key in METRICS:
                row[f"{key}_ci"] = float(t * x.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        rows.append(row)
    return pl.DataFrame(rows)


def format_table(df: pl.DataFrame) -> str:
    """Plain-text table: one line per strategy, metrics as ``mean ± ci``."""
    head = ["strategy", "eff. ratio", "wasted", "eff/1k tok", "grad energy", "prompts", "w/ signal", "traj",
            "ext"]
    lines = []
    for r in df.iter_rows(named=True):
        lines.append([
            r["strategy"],
            f"{100 * r['effective_ratio']:.1f}% ± {100 * r['effective_ratio_ci']:.1f}",
            f"{100 * r['wasted_share']:.1f}% ± {100 * r['wasted_share_ci']:.1f}",
            f"{r['eff_per_1k_tokens']:.3f} ± {r['eff_per_1k_tokens_ci']:.3f}",
            f"{r['grad_energy']:.4f} ± {r['grad_energy_ci']:.4f}",
            f"{r['prompts']:.0f}", f"{r['signal_prompts']:.0f}", f"{r['trajectories']:.0f}", f"{r['continuations']:.0f}",
        ])
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*x) for x in lines]
    return "\n".join(out)
