"""Per-prompt Beta posterior over the prompt's success rate, with the model as the prior.

For a prompt predicted at iteration ``T`` the record is every earlier labelled root of that prompt
(iteration ``t < T``), each contributing ``c_t`` trajectories with mean reward ``y_t``, discounted by
``gamma ** (T - 1 - t)`` (the last iteration counts fully; the policy moves, so older outcomes
count less)::

    s = sum_t gamma^(T-1-t) * c_t * y_t          n = sum_t gamma^(T-1-t) * c_t
    posterior mean = (kappa * p_model + s) / (kappa + n)

i.e. a Beta(kappa*p, kappa*(1-p)) prior updated with the discounted counts. With kappa = 4 a prompt
seen 16 times (no discount) takes 16/20 of its prediction from its own record.
A root's record is its ``subtree_mean_reward`` over ``subtree_count`` (raw rollouts and any prefix
extensions below it alike).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.predictor.base import labelled


class PromptHistory:
    """Discounted success counts per (prompt, iteration), queried for nodes at later iterations."""

    def __init__(self, discount: float, prior_strength: float):
        self.discount = discount
        self.kappa = prior_strength
        self.records = pl.DataFrame(
            schema={"prompt_id": pl.Utf8, "h_iter": pl.Int64, "succ": pl.Float64, "count": pl.Float64}
        )

    @classmethod
    def from_nodes(cls, nodes: pl.DataFrame, discount: float, prior_strength: float) -> PromptHistory:
        """Build from all labelled root rows of ``nodes`` (non-roots are ignored)."""
        hist = cls(discount, prior_strength)
        roots = labelled(nodes).filter(pl.col("depth").fill_null(0) == 0) if nodes.height else nodes
        if roots.height:
            hist.records = (
                roots.select(
                    pl.col("prompt_id"),
                    pl.col("iteration").cast(pl.Int64).fill_null(0).alias("h_iter"),
                    (pl.col("subtree_mean_reward").cast(pl.Float64).clip(0.0, 1.0) * pl.col("subtree_count"))
                    .cast(pl.Float64)
                    .alias("succ"),
                    pl.col("subtree_count").cast(pl.Float64).alias("count"),
                )
                .group_by("prompt_id", "h_iter")
                .agg(pl.col("succ").sum(), pl.col("count").sum())
            )
        return hist

    @property
    def n_prompts(self) -> int:
        return self.records["prompt_id"].n_unique() if self.records.height else 0

    def counts(
        self, prompt_ids: list[str | None], iterations: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Discounted ``(successes, trials)``, both ``(n,)``, from outcomes strictly before each query's
        iteration (``iterations`` ``(n,)``; None / negative = after everything recorded)."""
        n = len(prompt_ids)
        if n == 0 or self.records.height == 0:
            return np.zeros(n), np.zeros(n)
        horizon = int(self.records["h_iter"].max()) + 1
        it = np.full(n, horizon) if iterations is None else np.where(iterations < 0, horizon, iterations)
        q = pl.DataFrame({"row": np.arange(n), "prompt_id": prompt_ids, "q_iter": it.astype(np.int64)})
        j = (
            q.join(self.records, on="prompt_id", how="inner")
            .filter(pl.col("h_iter") < pl.col("q_iter"))
            .with_columns(
                (pl.lit(self.discount) ** (pl.col("q_iter") - 1 - pl.col("h_iter")).cast(pl.Float64)).alias(
                    "g"
                )
            )
            .group_by("row")
            .agg(
                (pl.col("g") * pl.col("succ")).sum().alias("s"),
                (pl.col("g") * pl.col("count")).sum().alias("n"),
            )
        )
        s, m = np.zeros(n), np.zeros(n)
        rows = j["row"].to_numpy()
        s[rows] = j["s"].to_numpy()
        m[rows] = j["n"].to_numpy()
        return s, m

    def posterior(
        self, prior: np.ndarray, prompt_ids: list[str | None], iterations: np.ndarray | None
    ) -> np.ndarray:
        """Posterior mean ``(n,)`` given the model prior ``(n,)`` in [0, 1]."""
        s, m = self.counts(prompt_ids, iterations)
        denom = self.kappa + m
        out = np.where(denom > 0, (self.kappa * prior + s) / np.maximum(denom, 1e-12), prior)
        return np.clip(out, 0.0, 1.0)
