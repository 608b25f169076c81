"""Policy-gradient update: clipped surrogate (PPO / GRPO), token level, assistant tokens only.

Training data is one sequence per generated trajectory: the root -> leaf token ids (prompt,
actions, observations, exactly as the engine saw them) with a loss mask that is 1 only on the
action tokens the trajectory itself generated (prompt, observations and a shared prefix that an
extension continued from are masked). Each loss token carries its turn's advantage and its
old log-prob from the rollout record.

Per token, with ``ratio = exp(logp − logp_old)``::

    loss_t = −min(ratio·A, clip(ratio, 1−ε_low, 1+ε_high)·A) + β·KL_k3(π ‖ π_ref)

averaged over all loss tokens of a minibatch (token-level mean, as in DAPO), accumulated over
micro-batches, then one AdamW step with gradient clipping.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import torch

from trace_core.policy.config import UpdateConfig
from trace_core.rollout_nodes import trajectories


@dataclass(frozen=True)
class TrainSequence:
    """One trajectory as aligned per-token lists of length L (value at i is about token i)."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 on this trajectory's own action tokens
    advantages: list[float]
    old_logprobs: list[float]
    trajectory_id: str = ""


def build_sequences(nodes: pl.DataFrame, chat: Any, messages_by_prompt: Mapping[str, list[dict[str, str]]],
                    *, skip_zero_advantage: bool = True) -> list[TrainSequence]:
    """Training sequences from a node table with advantages (``compute_advantages``).

    ``messages_by_prompt[prompt_id]`` are the episode's initial messages (``env.reset(task).messages()``).
    """
    rows = {r["node_id"]: r for r in nodes.iter_rows(named=True)}
    out = []
    for traj in trajectories(nodes):
        ids = chat.prompt_ids(messages_by_prompt[traj.prompt_id])
        mask, adv, old = [0] * len(ids), [0.0] * len(ids), [0.0] * len(ids)
        for nid, own in zip(traj.path[1:], traj.own[1:], strict=True):
            r = rows[nid]
            a_ids = list(r["action_token_ids"])
            a = float(r["advantage"] or 0.0)
            ids += a_ids
            mask += [int(own)] * len(a_ids)
            adv += [a] * len(a_ids)
            old += [float(x) for x in r["action_logprobs"]]
            if r["observation_text"] is not None:
                o_ids = chat.observation_ids(r["observation_text"], action_closed=chat.ends_closed(a_ids))
                ids += o_ids
                mask += [0] * len(o_ids)
                adv += [0.0] * len(o_ids)
                old += [0.0] * len(o_ids)
        if skip_zero_advantage and not any(m and x != 0.0 for m, x in zip(mask, adv, strict=True)):
            continue
        out.append(TrainSequence(ids, mask, adv, old, traj.trajectory_id))
    return out


def make_optimizer(model: torch.nn.Module, cfg: UpdateConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over trainable parameters and a linear warm-up then constant LR schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    warm = cfg.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    return opt, sched


def collate(seqs: Sequence[TrainSequence], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded tensors, each (B, L)."""
    length = max(len(s.input_ids) for s in seqs)

    def pad(vals: list, fill: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([v + [fill] * (length - len(v)) for v in vals], dtype=dtype, device=device)

    return {
        "input_ids": pad([s.input_ids for s in seqs], pad_id, torch.long),
        "attention_mask": pad([[1] * len(s.input_ids) for s in seqs], 0, torch.long),
        "loss_mask": pad([s.loss_mask for s in seqs], 0, torch.float32),
        "advantages": pad([s.advantages for s in seqs], 0.0, torch.float32),
        "old_logprobs": pad([s.old_logprobs for s in seqs], 0.0, torch.float32),
    }


def token_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """(B, L) log p(token_i | tokens_<i); position 0 (no context) is 0."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    taken = logp.gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return torch.cat([torch.zeros_like(taken[:, :1]), taken], dim=1)


def surrogate_loss(logp: torch.Tensor, batch: dict[str, torch.Tensor], cfg: UpdateConfig,
                   ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sum over loss tokens of the clipped surrogate (+ β·k3 KL); all inputs (B, L). Returns the
    *sum* (the caller divides by the minibatch's loss-token count) and summed statistics."""
    mask, adv = batch["loss_mask"], batch["advantages"]
    log_ratio = (logp - batch["old_logprobs"]) * mask
    ratio = torch.exp(log_ratio)
    hi = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps, 1.0 + hi)
    per_tok = -torch.minimum(ratio * adv, clipped * adv)
    stats = {
        "clip_frac": (((ratio - clipped).abs() > 1e-8).float() * mask).sum().detach(),
        "approx_kl_old": (((ratio - 1) - log_ratio) * mask).sum().detach(),  # k3 estimate of KL(old ‖ new)
    }
    if ref_logp is not None and cfg.kl_coef > 0:
        d = (ref_logp - logp) * mask
        kl = torch.exp(d) - d - 1  # k3 estimator of KL(π ‖ π_ref), >= 0
        per_tok = per_tok + cfg.kl_coef * kl
        stats["kl_ref"] = (kl * mask).sum().detach()
    return (per_tok * mask).sum(), stats


def update_policy(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                  seqs: Sequence[TrainSequence], cfg: UpdateConfig, *, pad_id: int, seed: int = 0,
                  ref_model: torch.nn.Module | None = None) -> dict[str, float]:
    """Run ``cfg.ppo_epochs`` passes of minibatch steps over ``seqs``; returns mean metrics."""
    if not seqs:
        return {"steps": 0.0, "sequences": 0.0}
    device = next(model.parameters()).device
    rng = np.random.default_rng(seed)
    model.train()
    sums: dict[str, float] = {}
    n_steps, n_tokens, t0 = 0, 0.0, time.perf_counter()
    for _ in range(cfg.ppo_epochs):
        order = rng.permutation(len(seqs))
        for start in range(0, len(order), cfg.minibatch_size):
            mb = [seqs[i] for i in order[start:start + cfg.minibatch_size]]
            mb.sort(key=lambda s: len(s.input_ids))  # micro-batches of similar length pad little
            tokens = float(sum(sum(s.loss_mask) for s in mb))
            if tokens == 0:
                continue
            for m0 in range(0, len(mb), cfg.micro_batch_size):
                batch = collate(mb[m0:m0 + cfg.micro_batch_size], pad_id, device)
                with _autocast(cfg, device):
                    logp = token_logprobs(model, batch, cfg.temperature)
                    ref = None
                    if ref_model is not None and cfg.kl_coef > 0:
                        with torch.no_grad():
                            ref = token_logprobs(ref_model, batch, cfg.temperature)
                loss, stats = surrogate_loss(logp, batch, cfg, ref)
                (loss / tokens).backward()
                for k, v in {"loss": loss.detach(), **stats}.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(grad_norm)
            n_steps += 1
            n_tokens += tokens
    seconds = time.perf_counter() - t0
    out = {k: v / max(n_tokens, 1.0) for k, v in sums.items() if k != "grad_norm"}
    out.update(grad_norm=sums.get("grad_norm", 0.0) / max(n_steps, 1), steps=float(n_steps),
               sequences=float(len(seqs)), loss_tokens=n_tokens / cfg.ppo_epochs, seconds=seconds,
               samples_per_s=len(seqs) * cfg.ppo_epochs / max(seconds, 1e-9), lr=float(scheduler.get_last_lr()[0]))
    return out


def _autocast(cfg: UpdateConfig, device: torch.device) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16) if cfg.autocast_bf16 else contextlib.nullcontext()
