"""Hierarchical Beta-Binomial prior of success rates: trend -> (family, difficulty) cell -> prompt.

Data: outcome counts ``(s, n)`` per (prompt, iteration) from the raw rollouts (continuations are a
selected sample of a prompt and are left out), plus optional per-cell counts measured before
training (the held-out evaluation: ``cell_prior``, iteration -1, no prompt). A query for iteration
``T`` sees only counts of iterations ``< T``, each weighted ``discount ** max(T - 1 - t, 0)``
(the policy moves; the latest iteration counts fully).

* trend: logistic regression of success on family, difficulty and family x difficulty
  (scikit-learn, counts as sample weights): thin or unseen cells borrow their family's slope;
* cell: ``rate ~ Beta(k_c * trend, k_c * (1 - trend))``, posterior mean with the cell's counts;
* prompt: ``rate ~ Beta(k_p * cell, k_p * (1 - cell))``, posterior mean with the prompt's counts
  plus optional ``extra`` counts (a prefix's sibling rollouts of the same iteration).

With ``fresh_cells`` each (family, difficulty) has two cells: the first visits of its prompts (and
the held-out cell prior) predict a prompt never sampled, the later visits a prompt with a record.
Training on a prompt raises its own success rate, so one pooled cell over-predicts the prompts it
has not trained on (measured in the epochs setting: QA first visits predicted 0.48, sampled 0.39).

Empirical Bayes: ``k_c`` maximises the prequential likelihood of each recorded (prompt, iteration)
outcome under the cell mean as of that iteration; ``k_p`` then maximises the prequential
Beta-Binomial marginal likelihood of those outcomes given the prompt's earlier record (scipy,
bounded search over ``log k``). A fixed strength in the config overrides either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.optimize import minimize_scalar
from scipy.special import betaln
from sklearn.linear_model import LogisticRegression

from trace_core.predictor.base import labelled
from trace_core.predictor.config import PriorConfig

COUNTS_SCHEMA = {"prompt_id": pl.Utf8, "task": pl.Utf8, "difficulty": pl.Int64, "iteration": pl.Int64,
                 "s": pl.Float64, "n": pl.Float64}  # fmt: skip
DEFAULT_STRENGTH = {"cell": 10.0, "prompt": 4.0}  # before there is data to estimate them
DEFAULT_DISCOUNT = 0.7


def _logit(p):
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-6, 1 - 1e-6)
    return np.log(p) - np.log1p(-p)


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=np.float64)))


def _normalise(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select(
        pl.col("prompt_id").cast(pl.Utf8), pl.col("task").cast(pl.Utf8).fill_null(""),
        pl.col("difficulty").cast(pl.Int64).fill_null(-1), pl.col("iteration").cast(pl.Int64).fill_null(0),
        pl.col("s").cast(pl.Float64), pl.col("n").cast(pl.Float64),
    )  # fmt: skip


def outcome_counts(nodes: pl.DataFrame) -> pl.DataFrame:
    """``(s, n)`` per (prompt, iteration): the raw rollouts' rewards clipped to [0, 1]; a labelled
    root with no raw leaf in the frame contributes its subtree label. Columns ``COUNTS_SCHEMA``."""
    if nodes.height == 0:
        return pl.DataFrame(schema=COUNTS_SCHEMA)
    raw = (
        nodes.filter(pl.col("is_leaf").fill_null(False) & (pl.col("origin") == "raw") & pl.col("reward").is_not_null())
        .group_by("prompt_id", "iteration")
        .agg(pl.col("task").first(), pl.col("difficulty").first(),
             pl.col("reward").cast(pl.Float64).clip(0.0, 1.0).sum().alias("s"), pl.len().cast(pl.Float64).alias("n"))
    )  # fmt: skip
    roots = (
        labelled(nodes).filter(pl.col("depth").fill_null(0) == 0)
        .join(raw.select("prompt_id", "iteration"), on=["prompt_id", "iteration"], how="anti")
        .select("prompt_id", "iteration", "task", "difficulty",
                (pl.col("subtree_mean_reward").cast(pl.Float64).clip(0.0, 1.0) * pl.col("subtree_count")).alias("s"),
                pl.col("subtree_count").cast(pl.Float64).alias("n"))
    )  # fmt: skip
    # sorted: polars' group_by order varies run to run; fits and float sums must not
    return _normalise(pl.concat([_normalise(raw), _normalise(roots)])).sort("iteration", "prompt_id", nulls_last=True)


def cell_counts(cell_prior: pl.DataFrame) -> pl.DataFrame:
    """A ``(task, difficulty, n_success, n_total)`` frame as counts of iteration -1 (before training)."""
    missing = {"task", "difficulty", "n_success", "n_total"} - set(cell_prior.columns)
    if missing:
        raise ValueError(f"cell_prior lacks column(s) {sorted(missing)}; needs task, difficulty, n_success, n_total")
    return _normalise(cell_prior.select(
        pl.lit(None, dtype=pl.Utf8).alias("prompt_id"), "task", "difficulty", pl.lit(-1).alias("iteration"),
        pl.col("n_success").alias("s"), pl.col("n_total").alias("n"),
    ).filter(pl.col("n") > 0))  # fmt: skip


@dataclass(frozen=True)
class PriorView:
    """Per-row posterior means (all ``(n,)``): ``prompt``, its ``cell``, and the discounted
    trajectories behind each level (``evidence``: the prompt's, with siblings; ``cell_evidence``)."""

    prompt: np.ndarray
    cell: np.ndarray
    evidence: np.ndarray
    cell_evidence: np.ndarray

    def take(self, rows: np.ndarray) -> PriorView:
        return PriorView(self.prompt[rows], self.cell[rows], self.evidence[rows], self.cell_evidence[rows])


class Trend:
    """``logit P(success) = b + a_task + (c + c_task) * difficulty`` fitted on cell counts."""

    def __init__(self, tasks: list[str], coef: np.ndarray, intercept: float):
        self.tasks, self.coef, self.intercept = tasks, coef, intercept

    def _x(self, task: np.ndarray, diff: np.ndarray) -> np.ndarray:
        onehot = (np.asarray(task, dtype=object)[:, None] == np.asarray(self.tasks, dtype=object)[None, :]).astype(float)
        d = np.maximum(np.asarray(diff, dtype=np.float64), 0.0)[:, None]
        return np.concatenate([onehot, d, onehot * d], axis=1)

    def logit(self, task, diff) -> np.ndarray:
        return self._x(task, diff) @ self.coef + self.intercept

    @classmethod
    def fit(cls, cells: pl.DataFrame, base: float, c: float) -> Trend:
        tasks = sorted(cells["task"].unique().to_list())
        s, n = cells["s"].to_numpy(), cells["n"].to_numpy()
        k = 2 * len(tasks) + 1
        if n.sum() <= 0:
            return cls(tasks, np.zeros(k), float(_logit(base)))
        if s.sum() <= 1e-9 or (n - s).sum() <= 1e-9:  # one class only: a smoothed constant
            return cls(tasks, np.zeros(k), float(_logit((s.sum() + 0.5) / (n.sum() + 1.0))))
        trend = cls(tasks, np.zeros(k), 0.0)
        x = trend._x(cells["task"].to_numpy(), cells["difficulty"].to_numpy())
        xx, yy = np.concatenate([x, x]), np.r_[np.ones(len(s)), np.zeros(len(s))]
        ww = np.r_[s, n - s]
        keep = ww > 0
        lr = LogisticRegression(C=c, max_iter=500).fit(xx[keep], yy[keep], sample_weight=ww[keep])
        return cls(tasks, lr.coef_[0].astype(np.float64), float(lr.intercept_[0]))


class HierarchicalPrior:
    """See the module docstring. ``fit(counts)`` then ``posterior(...)`` for any iteration."""

    def __init__(self, cfg: PriorConfig, base: float = 0.5):
        self.cfg, self.base = cfg, base
        self.counts = pl.DataFrame(schema=COUNTS_SCHEMA)
        self.kappa_cell = cfg.cell_strength if cfg.cell_strength is not None else DEFAULT_STRENGTH["cell"]
        self.kappa_prompt = cfg.prompt_strength if cfg.prompt_strength is not None else DEFAULT_STRENGTH["prompt"]
        self.discount = cfg.discount if cfg.discount is not None else DEFAULT_DISCOUNT
        self.prompt_discount: float | None = cfg.prompt_discount  # None: the cell's discount
        self._tables: dict[int, tuple] = {}

    @property
    def empty(self) -> bool:
        return self.counts.height == 0

    def fit(self, counts: pl.DataFrame) -> dict:
        """Store the counts and set discount and strengths (empirical Bayes unless fixed in the config)."""
        self.counts = _normalise(counts)
        best = None
        for gamma, gamma_p in self._discount_pairs():
            self.discount, self.prompt_discount, self._tables = gamma, gamma_p, {}
            kc, kp, loss, n_units = self._strengths()
            if best is None or loss < best[4] - 1e-9 * max(1.0, abs(best[4])):  # near-ties: the first wins
                best = (gamma, gamma_p, kc, kp, loss, n_units)
        gamma, gamma_p, self.kappa_cell, self.kappa_prompt, loss, n_units = best
        if n_units == 0:  # nothing to choose by: the configured or default discounts
            gamma = self.cfg.discount if self.cfg.discount is not None else DEFAULT_DISCOUNT
            gamma_p = self.cfg.prompt_discount
        if (gamma, gamma_p) != (self.discount, self.prompt_discount):
            self.discount, self.prompt_discount, self._tables = gamma, gamma_p, {}
        return {"kappa_cell": self.kappa_cell, "kappa_prompt": self.kappa_prompt, "discount": self.discount,
                "prompt_discount": self.prompt_discount if self.prompt_discount is not None else self.discount,
                "prior_units": n_units, "prior_loss_per_unit": loss / max(n_units, 1)}  # fmt: skip

    def _discount_pairs(self) -> list[tuple[float, float | None]]:
        """The (cell, prompt) discounts to choose from; a prompt discount of None is the cell's."""
        cells = [self.cfg.discount] if self.cfg.discount is not None else self.cfg.discount_grid
        if self.cfg.prompt_discount is not None:
            return [(g, self.cfg.prompt_discount) for g in cells]
        if not self.cfg.prompt_discount_grid:
            return [(g, None) for g in cells]
        return [(g, gp) for g in cells for gp in self.cfg.prompt_discount_grid if gp >= g]

    def _strengths(self) -> tuple[float, float, float, int]:
        """``(k_cell, k_prompt, prequential loss, units)`` at the current discount."""
        kc = self.cfg.cell_strength if self.cfg.cell_strength is not None else DEFAULT_STRENGTH["cell"]
        kp = self.cfg.prompt_strength if self.cfg.prompt_strength is not None else DEFAULT_STRENGTH["prompt"]
        units = self._units()  # only outcomes whose cell had a record before them inform a strength
        if units is None:
            return kc, kp, 0.0, 0
        if self.cfg.cell_strength is None:
            kc = self._search(lambda k: self._cell_loss(k, units))
        if self.cfg.prompt_strength is None:
            kp = self._search(lambda k: self._prompt_loss(kc, k, units))
        return kc, kp, self._prompt_loss(kc, kp, units), len(units["s"])

    # -- as-of tables ---------------------------------------------------------------------------
    def tables(self, t: int) -> tuple[dict[bool, Trend], pl.DataFrame, pl.DataFrame]:
        """As of iteration ``t``: the trends, cells ``(task, difficulty, revisit, cs, cn)``, prompts
        ``(prompt_id, ps, pn)``. ``revisit`` is always False unless ``fresh_cells``: then a prompt's
        first recorded iteration (and the held-out cell prior) fills the False cells, later visits
        the True ones; trend False is fitted on the False cells, trend True on all."""
        if t not in self._tables:
            age = (t - 1 - pl.col("iteration")).clip(0, None).cast(pl.Float64)
            gamma_p = self.prompt_discount if self.prompt_discount is not None else self.discount
            c = self.counts.filter(pl.col("iteration") < t).with_columns(
                (self.discount**age).alias("w"), (gamma_p**age).alias("wp"))
            revisit = pl.lit(False)
            if self.cfg.fresh_cells:
                revisit = (pl.col("prompt_id").is_not_null()
                           & (pl.col("iteration") > pl.col("iteration").min().over("prompt_id")))
            c = c.with_columns(revisit.alias("revisit"))
            # sorted by key: polars' group_by order varies run to run, and sums must not
            cells = c.group_by("task", "difficulty", "revisit").agg(
                (pl.col("w") * pl.col("s")).sum().alias("cs"), (pl.col("w") * pl.col("n")).sum().alias("cn")).sort(
                "task", "difficulty", "revisit")
            prompts = c.filter(pl.col("prompt_id").is_not_null()).group_by("prompt_id").agg(
                (pl.col("wp") * pl.col("s")).sum().alias("ps"), (pl.col("wp") * pl.col("n")).sum().alias("pn")).sort(
                "prompt_id")
            pooled = cells.group_by("task", "difficulty").agg(pl.col("cs").sum(), pl.col("cn").sum()).sort(
                "task", "difficulty")
            trend = Trend.fit(pooled.rename({"cs": "s", "cn": "n"}), self.base, self.cfg.trend_c)
            trends = {True: trend, False: trend}
            if self.cfg.fresh_cells:
                trends[False] = Trend.fit(cells.filter(~pl.col("revisit")).rename({"cs": "s", "cn": "n"}),
                                          self.base, self.cfg.trend_c)
            self._tables[t] = (trends, cells, prompts)
        return self._tables[t]

    def _asof(self, task, diff, pid, t: np.ndarray) -> dict[str, np.ndarray]:
        """Per query: trend logit and the discounted cell / prompt counts as of its iteration (with
        ``fresh_cells``, the cell of its kind: first visits for a prompt without a record)."""
        n = len(t)
        out = {k: np.zeros(n) for k in ("trend", "cs", "cn", "ps", "pn")}
        q = pl.DataFrame({"row": np.arange(n), "task": task, "difficulty": diff, "prompt_id": pid, "t": t},
                         schema_overrides={"task": pl.Utf8, "difficulty": pl.Int64, "prompt_id": pl.Utf8})
        q = q.with_columns(pl.col("task").fill_null(""), pl.col("difficulty").fill_null(-1))
        for ti in np.unique(t):
            trends, cells, prompts = self.tables(int(ti))
            part = q.filter(pl.col("t") == ti).join(prompts, on="prompt_id", how="left")
            part = part.with_columns((pl.col("pn").is_not_null() & pl.lit(self.cfg.fresh_cells)).alias("revisit"))
            part = (part.join(cells, on=["task", "difficulty", "revisit"], how="left")
                    .with_columns(pl.col("cs", "cn", "ps", "pn").fill_null(0.0)))  # fmt: skip
            rows = part["row"].to_numpy()
            seen = part["revisit"].to_numpy()
            task_a, diff_a = part["task"].to_numpy(), part["difficulty"].to_numpy()
            out["trend"][rows] = np.where(seen, trends[True].logit(task_a, diff_a), trends[False].logit(task_a, diff_a))
            for k in ("cs", "cn", "ps", "pn"):
                out[k][rows] = part[k].to_numpy()
        return out

    def _means(self, a: dict[str, np.ndarray], kc: float, kp: float, es=0.0, en=0.0):
        cell = (kc * _sigmoid(a["trend"]) + a["cs"]) / np.maximum(kc + a["cn"], 1e-12)
        prompt = (kp * cell + a["ps"] + es) / np.maximum(kp + a["pn"] + en, 1e-12)
        return np.clip(prompt, 1e-4, 1 - 1e-4), np.clip(cell, 1e-4, 1 - 1e-4)

    def counts_asof(self, frame: pl.DataFrame, t: np.ndarray) -> dict[str, np.ndarray]:
        """Per row of ``frame`` (task, difficulty, prompt_id): ``trend`` logit, cell ``cs/cn`` and
        prompt ``ps/pn`` discounted counts as of iterations ``t`` ``(n,)``."""
        col = {c: frame[c] if c in frame.columns else pl.Series([None] * frame.height, dtype=dt)
               for c, dt in (("task", pl.Utf8), ("difficulty", pl.Int64), ("prompt_id", pl.Utf8))}  # fmt: skip
        return self._asof(col["task"], col["difficulty"], col["prompt_id"], np.asarray(t, dtype=np.int64))

    def posterior(self, frame: pl.DataFrame, t: np.ndarray, extra_s=None, extra_n=None) -> PriorView:
        """The prompt and cell posterior means of the rows of ``frame`` as of iterations ``t``
        ``(n,)``; ``extra_s/extra_n`` ``(n,)`` add same-iteration counts (a prefix's siblings)."""
        if frame.height == 0:
            return PriorView(*(np.zeros(0) for _ in range(4)))
        a = self.counts_asof(frame, t)
        es = 0.0 if extra_s is None else np.asarray(extra_s, dtype=np.float64)
        en = 0.0 if extra_n is None else np.asarray(extra_n, dtype=np.float64)
        prompt, cell = self._means(a, self.kappa_cell, self.kappa_prompt, es, en)
        return PriorView(prompt, cell, a["pn"] + en, a["cn"])

    # -- empirical Bayes --------------------------------------------------------------------------
    def _units(self) -> dict[str, np.ndarray] | None:
        """Every recorded (prompt, iteration) outcome with its as-of-that-iteration counts."""
        u = self.counts.filter(pl.col("prompt_id").is_not_null() & (pl.col("iteration") >= 0))
        if u.height == 0:
            return None
        last = int(u["iteration"].max())
        u = u.filter(pl.col("iteration") > last - self.cfg.window)
        a = self._asof(u["task"], u["difficulty"], u["prompt_id"], u["iteration"].to_numpy())
        seen = a["cn"] > 0
        if not seen.any():
            return None
        return {k: v[seen] for k, v in a.items()} | {"s": u["s"].to_numpy()[seen], "n": u["n"].to_numpy()[seen]}

    def _search(self, loss) -> float:
        lo, hi = np.log(self.cfg.min_strength), np.log(max(self.cfg.max_strength, self.cfg.min_strength * 1.01))
        res = minimize_scalar(lambda z: loss(float(np.exp(z))), bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-2})  # fmt: skip
        return float(np.exp(res.x))

    def _cell_loss(self, kc: float, u: dict[str, np.ndarray]) -> float:
        _, cell = self._means(u, kc, 1.0)
        return float(-np.sum(u["s"] * np.log(cell) + (u["n"] - u["s"]) * np.log1p(-cell)))

    def _prompt_loss(self, kc: float, kp: float, u: dict[str, np.ndarray]) -> float:
        _, cell = self._means(u, kc, kp)
        a = kp * cell + u["ps"]
        b = kp * (1 - cell) + np.maximum(u["pn"] - u["ps"], 0.0)
        return float(-np.sum(betaln(a + u["s"], b + u["n"] - u["s"]) - betaln(a, b)))

    # -- persistence --------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"kappa_cell": self.kappa_cell, "kappa_prompt": self.kappa_prompt, "discount": self.discount,
                "prompt_discount": self.prompt_discount, "base": self.base, "counts": self.counts.to_dict(as_series=False)}  # fmt: skip

    @classmethod
    def from_state(cls, cfg: PriorConfig, state: dict) -> HierarchicalPrior:
        prior = cls(cfg, float(state["base"]))
        prior.counts = pl.DataFrame(state["counts"], schema=COUNTS_SCHEMA)
        prior.kappa_cell, prior.kappa_prompt = float(state["kappa_cell"]), float(state["kappa_prompt"])
        prior.discount = float(state["discount"])
        gamma_p = state.get("prompt_discount")  # files from before the prompt's own discount: the cell's
        prior.prompt_discount = None if gamma_p is None else float(gamma_p)
        return prior


def sibling_counts(nodes: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row ``(successes, count)``, each ``(n,)``: the raw rollouts of the same prompt and
    iteration present in the frame, the row's own trajectory left out; zeros for roots.

    At prefix scoring every raw rollout of the iteration has finished, so a prefix may use how
    its siblings ended; a root (scored before any rollout) never does."""
    n = nodes.height
    need = {"is_leaf", "origin", "reward", "trajectory_id", "prompt_id", "iteration"}
    if n == 0 or need - set(nodes.columns):
        return np.zeros(n), np.zeros(n)
    leaves = nodes.filter(pl.col("is_leaf").fill_null(False) & (pl.col("origin") == "raw")
                          & pl.col("reward").is_not_null()).select(
        "prompt_id", "iteration", "trajectory_id", pl.col("reward").cast(pl.Float64).clip(0.0, 1.0).alias("own"))
    tot = leaves.group_by("prompt_id", "iteration").agg(pl.col("own").sum().alias("S"), pl.len().alias("N"))
    own = leaves.unique("trajectory_id").select("trajectory_id", "own")
    q = (nodes.select(pl.int_range(n).alias("row"), "prompt_id", "iteration", "trajectory_id",
                      pl.col("depth").fill_null(0))
         .join(tot, on=["prompt_id", "iteration"], how="left").join(own, on="trajectory_id", how="left")
         .sort("row"))  # fmt: skip
    depth = q["depth"].to_numpy()
    es = q["S"].fill_null(0.0).to_numpy() - q["own"].fill_null(0.0).to_numpy()
    en = q["N"].fill_null(0).cast(pl.Float64).to_numpy() - q["own"].is_not_null().cast(pl.Float64).to_numpy()
    keep = depth > 0
    return np.where(keep, np.maximum(es, 0.0), 0.0), np.where(keep, np.maximum(en, 0.0), 0.0)
