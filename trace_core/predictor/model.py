"""The torch head: a correction to the prior's logit from hashed text + dense features.

``logit = prior_logit + text(x) + dense(x)`` (``hidden == 0``: logistic) or
``prior_logit + out(relu(text(x) + dense(x)))`` (``hidden > 0``: one ReLU layer whose first layer
is the EmbeddingBag). The correction starts at exactly zero (zero-initialised last layer), so an
untrained or barely trained head predicts the prior: the head refines it, never replaces it.

Training minimises the weighted binary cross-entropy on soft labels (a node with mean outcome
``y`` over ``c`` trajectories counts as ``c*y`` successes and ``c*(1-y)`` failures) plus a small
L2 on the text contribution, for a number of *optimiser steps* (not epochs): the batch is sized to
the data (``n/16`` nodes within ``[min_batch_size, batch_size]``) and the step count is at least
``min_steps`` (``warm_steps`` when warm-starting) and ``epochs`` passes, at most ``max_steps``.
SparseAdam updates the text table (a minibatch touches few of its rows), AdamW the rest.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from trace_core.predictor.config import ModelConfig
from trace_core.predictor.features import FeatureBatch


class SuccessHead(nn.Module):
    def __init__(self, n_buckets: int, n_dense: int, hidden: int):
        super().__init__()
        width = hidden if hidden > 0 else 1
        # sparse gradients: the optimiser step costs O(touched rows), not O(2**16 rows)
        self.text = nn.EmbeddingBag(n_buckets, width, mode="sum", sparse=True)
        nn.init.normal_(self.text.weight, std=0.01)
        self.dense = nn.Linear(n_dense, width)
        self.out = nn.Linear(hidden, 1) if hidden > 0 else None
        last = self.out if self.out is not None else self.dense
        nn.init.zeros_(last.weight)  # correction == 0 at start: the prediction is the prior
        nn.init.zeros_(last.bias)
        # dense standardisation, fitted once on the first training set and kept on warm starts
        self.register_buffer("mu", torch.zeros(n_dense))
        self.register_buffer("sd", torch.ones(n_dense))

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(n_buckets, n_dense, hidden)``: what ``SuccessHead(*shape)`` rebuilds."""
        return self.text.num_embeddings, self.dense.in_features, self.out.in_features if self.out is not None else 0

    def forward(self, idx, offsets, vals, dense, offset, with_text: bool = False):
        """``idx``/``vals`` ``(nnz,)``, ``offsets``/``offset`` ``(B,)``, ``dense`` ``(B, d)`` -> logits ``(B,)``
        (and the text part ``(B, width)`` when ``with_text``)."""
        t = self.text(idx, offsets, per_sample_weights=vals)
        h = t + self.dense((dense - self.mu) / self.sd)
        if self.out is not None:
            h = self.out(torch.relu(h))
        logit = offset + h.squeeze(-1)
        return (logit, t) if with_text else logit


def _tensors(fb: FeatureBatch, offset: np.ndarray):
    return (torch.from_numpy(fb.idx), torch.from_numpy(fb.offsets), torch.from_numpy(fb.vals),
            torch.from_numpy(fb.dense), torch.from_numpy(offset.astype(np.float32)))  # fmt: skip


def head_logits(head: SuccessHead, fb: FeatureBatch, offset: np.ndarray, batch: int = 8192) -> np.ndarray:
    """Logits ``(n,)`` float64 of every node of ``fb`` given the prior logits ``offset`` ``(n,)``."""
    head.eval()
    out = []
    with torch.no_grad():
        for s in range(0, fb.n, batch):
            rows = np.arange(s, min(s + batch, fb.n))
            out.append(head(*_tensors(fb.take(rows), offset[rows])).double().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def schedule(n: int, cfg: ModelConfig, warm: bool) -> tuple[int, int]:
    """``(batch, steps)`` for ``n`` training nodes (see the module docstring)."""
    batch = int(min(max(math.ceil(n / 16), cfg.min_batch_size), cfg.batch_size, max(n, 1)))
    steps = max(cfg.warm_steps if warm else cfg.min_steps, math.ceil(cfg.epochs * n / batch))
    return batch, int(min(steps, cfg.max_steps))


def new_head(fb: FeatureBatch, cfg: ModelConfig, n_buckets: int) -> SuccessHead:
    head = SuccessHead(n_buckets, fb.dense.shape[1], cfg.hidden)
    sd = fb.dense.std(axis=0)
    head.mu.copy_(torch.from_numpy(fb.dense.mean(axis=0)))
    head.sd.copy_(torch.from_numpy(np.where(sd > 1e-6, sd, 1.0).astype(np.float32)))
    return head


def train_head(fb: FeatureBatch, offset: np.ndarray, y: np.ndarray, w: np.ndarray, cfg: ModelConfig,
               n_buckets: int, head: SuccessHead | None = None) -> tuple[SuccessHead, dict]:  # fmt: skip
    """Train (or warm-start) a head on ``fb`` with prior logits ``offset``, soft labels ``y`` and
    weights ``w`` (all ``(n,)``). Returns the head and ``{steps, batch, train_loss}`` (the weighted
    log-loss of the last pass of steps)."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    warm = head is not None
    head = head if warm else new_head(fb, cfg, n_buckets)
    batch, steps = schedule(fb.n, cfg, warm)
    dense_params = [p for name, p in head.named_parameters() if not name.startswith("text.")]
    opts = [torch.optim.SparseAdam(list(head.text.parameters()), lr=cfg.lr),
            torch.optim.AdamW(dense_params, lr=cfg.lr, weight_decay=cfg.weight_decay)]  # fmt: skip
    yt, wt = torch.from_numpy(y.astype(np.float32)), torch.from_numpy(w.astype(np.float32))
    order, pos, recent = rng.permutation(fb.n), 0, []
    head.train()
    for _ in range(steps):
        if pos + batch > fb.n:  # next pass: a fresh permutation
            order, pos = rng.permutation(fb.n), 0
        rows = order[pos : pos + batch]
        pos += batch
        logits, text = head(*_tensors(fb.take(rows), offset[rows]), with_text=True)
        bw = wt[rows]
        nll = (nn.functional.binary_cross_entropy_with_logits(logits, yt[rows], reduction="none") * bw).sum()
        nll = nll / bw.sum().clamp_min(1e-9)
        loss = nll + cfg.text_l2 * text.pow(2).sum(-1).mean()
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()
        recent.append(float(nll.detach()))
    head.eval()
    tail = recent[-max(1, math.ceil(fb.n / batch)) :]
    return head, {"steps": steps, "batch": batch, "train_loss": float(np.mean(tail)) if tail else None}
