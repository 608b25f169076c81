"""The torch head: hashed-text EmbeddingBag + standardised dense features -> logit.

``hidden == 0`` is logistic regression (EmbeddingBag of width 1 plus a linear term on the dense
features); ``hidden > 0`` an MLP with one ReLU layer whose first layer is the EmbeddingBag.
Training minimises the weighted binary cross-entropy on soft labels (a node with mean outcome
``y`` over ``c`` trajectories counts as ``c*y`` successes and ``c*(1-y)`` failures), full epochs
of shuffled minibatches with SparseAdam (text table) + AdamW (the rest); ``train_head`` warm-starts from a previous head when given.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from trace_core.predictor.config import ModelConfig
from trace_core.predictor.features import FeatureBatch


class SuccessHead(nn.Module):
    def __init__(self, n_buckets: int, n_dense: int, hidden: int):
        super().__init__()
        width = hidden if hidden > 0 else 1
        # sparse gradients: a minibatch touches a few thousand of the 2**16 buckets, so the
        # optimiser step costs O(touched rows), not O(table) (10x faster on a small CPU)
        self.text = nn.EmbeddingBag(n_buckets, width, mode="sum", sparse=True)
        nn.init.normal_(self.text.weight, std=0.01)
        self.dense = nn.Linear(n_dense, width)
        self.out = nn.Linear(hidden, 1) if hidden > 0 else None
        # dense standardisation, fitted once on the first training set and kept on warm starts
        self.register_buffer("mu", torch.zeros(n_dense))
        self.register_buffer("sd", torch.ones(n_dense))

    def forward(self, idx: torch.Tensor, offsets: torch.Tensor, vals: torch.Tensor, dense: torch.Tensor):
        """``idx``/``vals`` ``(nnz,)``, ``offsets`` ``(B,)``, ``dense`` ``(B, d)`` -> logits ``(B,)``."""
        h = self.text(idx, offsets, per_sample_weights=vals) + self.dense((dense - self.mu) / self.sd)
        if self.out is not None:
            h = self.out(torch.relu(h))
        return h.squeeze(-1)


def _tensors(fb: FeatureBatch):
    return (
        torch.from_numpy(fb.idx),
        torch.from_numpy(fb.offsets),
        torch.from_numpy(fb.vals),
        torch.from_numpy(fb.dense),
    )


def head_logits(head: SuccessHead, fb: FeatureBatch, batch: int = 8192) -> np.ndarray:
    """Logits ``(n,)`` float64 of every node of ``fb`` (no grad, batched)."""
    head.eval()
    out = []
    with torch.no_grad():
        for s in range(0, fb.n, batch):
            out.append(head(*_tensors(fb.take(np.arange(s, min(s + batch, fb.n))))).double().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def train_head(
    fb: FeatureBatch,
    y: np.ndarray,
    w: np.ndarray,
    cfg: ModelConfig,
    n_buckets: int,
    head: SuccessHead | None = None,
) -> tuple[SuccessHead, float]:
    """Train (or warm-start) a head on ``fb`` with soft labels ``y`` ``(n,)`` and weights ``w`` ``(n,)``.

    Returns the head and the final epoch's weighted mean log-loss.
    """
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    warm = head is not None
    if head is None:
        head = SuccessHead(n_buckets, fb.dense.shape[1], cfg.hidden)
        mu = fb.dense.mean(axis=0)
        sd = fb.dense.std(axis=0)
        head.mu.copy_(torch.from_numpy(mu))
        head.sd.copy_(torch.from_numpy(np.where(sd > 1e-6, sd, 1.0).astype(np.float32)))
        # start at the base rate: the first epochs then learn contrasts, not the mean
        base = float(np.clip(np.sum(w * y) / max(np.sum(w), 1e-9), 1e-3, 1 - 1e-3))
        bias = head.out.bias if head.out is not None else head.dense.bias
        with torch.no_grad():
            bias.fill_(float(np.log(base / (1 - base))))
    dense_params = [p for name, p in head.named_parameters() if not name.startswith("text.")]
    opts = [
        torch.optim.SparseAdam(list(head.text.parameters()), lr=cfg.lr),
        torch.optim.AdamW(dense_params, lr=cfg.lr, weight_decay=cfg.weight_decay),
    ]
    yt, wt = torch.from_numpy(y.astype(np.float32)), torch.from_numpy(w.astype(np.float32))
    wsum_per_batch = None
    last = float("nan")
    for _ in range(cfg.warm_epochs if warm else cfg.epochs):
        head.train()
        order = rng.permutation(fb.n)
        tot, tot_w = 0.0, 0.0
        for s in range(0, fb.n, cfg.batch_size):
            rows = order[s : s + cfg.batch_size]
            logits = head(*_tensors(fb.take(rows)))
            bw = wt[rows]
            wsum_per_batch = bw.sum().clamp_min(1e-9)
            loss = (
                nn.functional.binary_cross_entropy_with_logits(logits, yt[rows], reduction="none") * bw
            ).sum()
            for opt in opts:
                opt.zero_grad()
            (loss / wsum_per_batch).backward()
            for opt in opts:
                opt.step()
            tot += float(loss.detach())
            tot_w += float(wsum_per_batch)
        last = tot / max(tot_w, 1e-9)
    head.eval()
    return head, last
