"""Policy-gradient update: clipped surrogate (PPO / GRPO), token level, assistant tokens only.

Training data is one sequence per generated trajectory: the root -> leaf token ids (prompt,
actions, observations, exactly as the engine saw them) with a loss mask that is 1 only on the
action tokens the trajectory itself generated (prompt, observations and a shared prefix that an
extension continued from are masked). Each loss token carries its turn's advantage and its
old log-prob from the rollout record.

Per token, with ``ratio = exp(logp − logp_old)``::

    loss_t = −min(ratio·A, clip(ratio, 1−ε_low, 1+ε_high)·A) + β·KL_k3(π ‖ π_ref)

averaged over all loss tokens of a minibatch (token-level mean, as in DAPO), accumulated over
micro-batches, then one AdamW step with gradient clipping. π_ref is the run's warm-start policy,
loaded only when β > 0 (β = 0 is the plain surrogate, bit for bit); the k3 term
``exp(ref − logp) − (ref − logp) − 1`` is >= 0, 0 where π = π_ref, and reported as ``kl``.
Memory: ``gradient_checkpointing`` and ``logprob_chunk`` (below); many GPUs: ``policy.distributed``.

Off-policy correction (``correct=True``: the asynchronous pipeline, ``run.max_staleness`` > 0):
decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy optimization"; AReaL's
decoupled loss) with a truncated behaviour weight (IMPALA's ρ̄, verl's truncated-IS rollout
correction). Before the first step, one no-grad pass gives π_prox, the policy being updated as it
stands (the weights of version v, while the rollouts came from version v - s)::

    w_t    = min(exp(logp_prox − logp_behav), C)          C = update.is_cap
    ratio  = exp(logp − logp_prox)
    loss_t = −w_t · min(ratio·A, clip(ratio, 1−ε_low, 1+ε_high)·A)

The trust region is kept around π_prox (where the clip has meaning); ``w`` moves the expectation
from the behaviour policy's samples to π_prox's. ``is_weight`` / ``is_weight_max`` /
``is_truncated`` report the untruncated weight's mean, max and the share of tokens truncated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.utils.checkpoint

from trace_core.nodes import trajectories
from trace_core.policy.config import UpdateConfig
from trace_core.policy.model import load_policy
from trace_core.stages.results import UpdateStats

LogProbFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # collated batch -> (B, L) token log-probs


@dataclass(frozen=True)
class TrainSequence:
    """One trajectory as aligned per-token lists of length L (value at i is about token i)."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 on this trajectory's own action tokens
    advantages: list[float]
    old_logprobs: list[float]  # the behaviour policy's (the rollout engine's)
    trajectory_id: str = ""
    prox_logprobs: list[float] | None = None  # π_prox, the policy at the update's start (correct=True)


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
    """AdamW (ε 1e-8) over trainable parameters and a linear warm-up then constant LR schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=1e-8, weight_decay=cfg.weight_decay)
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
        **({"prox_logprobs": pad([s.prox_logprobs for s in seqs], 0.0, torch.float32)}
           if all(s.prox_logprobs is not None for s in seqs) else {}),
    }


def token_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0,
                   chunk: int = 0) -> torch.Tensor:
    """(B, L) log p(token_i | tokens_<i); position 0 (no context) is 0.

    ``chunk`` > 0: the vocabulary log-softmax runs over ``chunk`` positions at a time, each chunk
    recomputed in backward (activation checkpointing), so the (B, L, V) fp32 logits never exist at
    once: memory O(B·chunk·V) instead of O(B·L·V) (Qwen3's V = 151,936). Same values as chunk=0
    to float rounding (tested: <= 1e-6).
    """
    if not chunk:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       use_cache=False).logits.float()
        logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
        taken = logp.gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
        return torch.cat([torch.zeros_like(taken[:, :1]), taken], dim=1)
    ids = batch["input_ids"]
    hidden = model.get_decoder()(input_ids=ids, attention_mask=batch["attention_mask"],
                                 use_cache=False).last_hidden_state  # the LM's final-norm output
    head = model.get_output_embeddings()

    def piece(h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(head(h).float() / temperature, dim=-1)
        return logp.gather(-1, target[..., None])[..., 0]

    parts = [torch.zeros_like(ids[:, :1], dtype=torch.float32)]
    for s in range(0, ids.shape[1] - 1, chunk):
        e = min(s + chunk, ids.shape[1] - 1)
        h, target = hidden[:, s:e], ids[:, s + 1:e + 1]
        if torch.is_grad_enabled():
            parts.append(torch.utils.checkpoint.checkpoint(piece, h, target, use_reentrant=False))
        else:
            parts.append(piece(h, target))
    return torch.cat(parts, dim=1)


def behaviour_weights(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor,
                      cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled PPO's per-token weight π_prox / π_behav truncated at ``cap``, all (B, L), 1 off the
    mask; and its summed statistics: ``is_weight`` (untruncated, summed over loss tokens),
    ``is_truncated`` (loss tokens above ``cap``) and ``is_weight_max``."""
    raw = torch.exp((prox_logp - behav_logp) * mask)
    on = mask > 0
    stats = {"is_weight": (raw * mask).sum().detach(),
             "is_truncated": ((raw > cap).float() * mask).sum().detach(),
             "is_weight_max": raw[on].max().detach() if bool(on.any()) else torch.zeros(())}
    return torch.clamp(raw, max=cap), stats


def surrogate_loss(logp: torch.Tensor, batch: dict[str, torch.Tensor], cfg: UpdateConfig,
                   ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sum over loss tokens of the clipped surrogate (+ β·k3 KL); all inputs (B, L). Returns the
    *sum* (the caller divides by the minibatch's loss-token count) and summed statistics. With
    ``batch["prox_logprobs"]`` the decoupled, truncated-IS surrogate of the module docstring."""
    mask, adv = batch["loss_mask"], batch["advantages"]
    prox = batch.get("prox_logprobs")
    log_ratio = (logp - (batch["old_logprobs"] if prox is None else prox)) * mask
    ratio = torch.exp(log_ratio)
    hi = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps, 1.0 + hi)
    per_tok = -torch.minimum(ratio * adv, clipped * adv)
    is_stats: dict[str, torch.Tensor] = {}
    if prox is not None:
        weight, is_stats = behaviour_weights(prox, batch["old_logprobs"], mask, cfg.is_cap)
        per_tok = per_tok * weight
    stats = {**is_stats,
        "clip_frac": (((ratio - clipped).abs() > 1e-8).float() * mask).sum().detach(),
        "approx_kl_old": (((ratio - 1) - log_ratio) * mask).sum().detach(),  # k3 estimate of KL(old ‖ new)
        # -log π of the sampled loss tokens: on-policy, an unbiased estimate of the policy's entropy
        "entropy": (-logp.detach() * mask).sum(),
    }
    if ref_logp is not None and cfg.uses_reference:
        d = (ref_logp - logp) * mask
        kl = torch.exp(d) - d - 1  # k3 estimator of KL(π ‖ π_ref), >= 0
        per_tok = per_tok + cfg.kl_coef * kl
        stats["kl"] = (kl * mask).sum().detach()
    return (per_tok * mask).sum(), stats


def update_policy(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                  seqs: Sequence[TrainSequence], cfg: UpdateConfig, *, pad_id: int, seed: int = 0,
                  ref_model: torch.nn.Module | None = None, logprobs: LogProbFn | None = None,
                  ref_logprobs: LogProbFn | None = None, rank: int = 0, world_size: int = 1,
                  correct: bool = False) -> UpdateStats:
    """Run ``cfg.ppo_epochs`` passes of minibatch steps over ``seqs``; returns mean metrics.

    ``correct``: the off-policy correction of the module docstring (``cfg.off_policy`` =
    ``decoupled``): π_prox is computed for every sequence before the first step.

    ``ref_model`` (used when ``cfg.uses_reference``): the reference policy of the k3 KL term.
    Data parallel (``trace_core.policy.distributed``): every rank holds all of ``seqs`` and draws
    the same minibatches; rank r trains on sequences r, r + W, ... of each (length-sorted, so the
    ranks' shares are alike) and the wrapped ``model`` averages gradients over the W ranks, hence
    the loss is scaled by W; ``logprobs`` / ``ref_logprobs`` then map a collated batch to (B, L)
    log-probs through the wrapped modules. The metrics are summed over ranks.
    """
    if not seqs:
        return UpdateStats()
    device = next(model.parameters()).device
    own_forward = logprobs is None  # else the caller set the wrapped model up (checkpointing included)
    if logprobs is None:
        def logprobs(b: dict[str, torch.Tensor]) -> torch.Tensor:
            return token_logprobs(model, b, cfg.temperature, cfg.logprob_chunk)
    if ref_logprobs is None and ref_model is not None:
        def ref_logprobs(b: dict[str, torch.Tensor]) -> torch.Tensor:
            return token_logprobs(ref_model, b, cfg.temperature, cfg.logprob_chunk)
    use_ref = ref_logprobs is not None and cfg.uses_reference
    rng = np.random.default_rng(seed)
    model.train()
    if correct and cfg.off_policy == "decoupled":
        seqs = with_proximal(seqs, logprobs, cfg, pad_id, device)
    sums: dict[str, float] = {}
    w_max = None  # the largest untruncated behaviour weight (a max, not a sum)
    n_steps, n_tokens, t0 = 0, 0.0, time.perf_counter()
    with _checkpointing(model, cfg.gradient_checkpointing and own_forward):
        for _ in range(cfg.ppo_epochs):
            order = rng.permutation(len(seqs))
            for start in range(0, len(order), cfg.minibatch_size):
                mb = [seqs[i] for i in order[start:start + cfg.minibatch_size]]
                mb.sort(key=lambda s: len(s.input_ids))  # micro-batches of similar length pad little
                tokens = float(sum(sum(s.loss_mask) for s in mb))
                if tokens == 0:
                    continue
                for micro in _rank_micro_batches(mb, cfg.micro_batch_size, rank, world_size):
                    batch = collate(micro, pad_id, device)
                    with _autocast(cfg, device):
                        logp = logprobs(batch)
                        ref = None
                        if use_ref:
                            with torch.no_grad():
                                ref = ref_logprobs(batch)
                    loss, stats = surrogate_loss(logp, batch, cfg, ref)
                    (loss / tokens if world_size == 1 else loss * world_size / tokens).backward()
                    if "is_weight_max" in stats:
                        w_max = max(w_max or 0.0, float(stats.pop("is_weight_max")))
                    for k, v in {"loss": loss.detach(), **stats}.items():
                        sums[k] = sums.get(k, 0.0) + float(v)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                full = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(full)
                n_steps += 1
                n_tokens += tokens
    if world_size > 1:
        sums = _sum_over_ranks(sums, device)
        w_max = _max_over_ranks(w_max, device)
    seconds = time.perf_counter() - t0
    means = {k: v / max(n_tokens, 1.0) for k, v in sums.items() if k != "grad_norm"}  # loss, clip_frac, approx_kl_old, kl, entropy, is_*
    if w_max is not None:
        means["is_weight_max"] = w_max
    return UpdateStats(**means, grad_norm=sums.get("grad_norm", 0.0) / max(n_steps, 1), steps=float(n_steps),
                       sequences=float(len(seqs)), loss_tokens=n_tokens / cfg.ppo_epochs, seconds=seconds,
                       samples_per_s=len(seqs) * cfg.ppo_epochs / max(seconds, 1e-9),
                       lr=float(scheduler.get_last_lr()[0]))


def with_proximal(seqs: Sequence[TrainSequence], logprobs: LogProbFn, cfg: UpdateConfig, pad_id: int,
                  device: torch.device) -> list[TrainSequence]:
    """``seqs`` with ``prox_logprobs``: the log-probs of the policy as it stands, before any step
    (no grad; micro-batches of ``cfg.micro_batch_size``, as the update's own forward passes). Every
    rank of a distributed update runs the same passes over all sequences (each is a collective)."""
    out: list[TrainSequence] = []
    with torch.no_grad():
        for m0 in range(0, len(seqs), cfg.micro_batch_size):
            micro = list(seqs[m0:m0 + cfg.micro_batch_size])
            batch = collate(micro, pad_id, device)
            with _autocast(cfg, device):
                logp = logprobs(batch).float().cpu()
            out += [dataclasses.replace(s, prox_logprobs=logp[b, :len(s.input_ids)].tolist())
                    for b, s in enumerate(micro)]
    return out


@functools.lru_cache(maxsize=1)
def reference_policy(path: str, device: str) -> torch.nn.Module:
    """The frozen reference policy of the KL term, loaded once per process (the run's warm start)."""
    return load_policy(path)[0].to(device).requires_grad_(False).eval()


def _rank_micro_batches(mb: list[TrainSequence], micro: int, rank: int, world_size: int) -> list[list[TrainSequence]]:
    """This rank's micro-batches of minibatch ``mb``. With W > 1 every rank runs the same number
    of forward/backward passes (each one is a collective); a rank short of sequences pads with a
    copy of ``mb[0]`` whose loss mask is 0 (zero loss and gradient)."""
    if world_size == 1:
        return [mb[m0:m0 + micro] for m0 in range(0, len(mb), micro)]
    mine = mb[rank::world_size]
    n = math.ceil(math.ceil(len(mb) / world_size) / micro)
    out = [mine[m0:m0 + micro] for m0 in range(0, len(mine), micro)]
    idle = dataclasses.replace(mb[0], loss_mask=[0] * len(mb[0].input_ids), trajectory_id="")
    return out + [[idle]] * (n - len(out))


def _max_over_ranks(value: float | None, device: torch.device) -> float | None:
    import torch.distributed as dist

    t = torch.tensor([-1.0 if value is None else value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return None if t.item() < 0 else float(t.item())


def _sum_over_ranks(sums: dict[str, float], device: torch.device) -> dict[str, float]:
    """Per-rank metric sums added over ranks (``grad_norm`` is already global: kept)."""
    import torch.distributed as dist

    keys = sorted(k for k in sums if k != "grad_norm")
    t = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return {**dict(zip(keys, t.tolist(), strict=True)), "grad_norm": sums.get("grad_norm", 0.0)}


def set_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """HF activation (gradient) checkpointing of every decoder block, non-reentrant (FSDP2-safe)."""
    if not on:  # transformers >= 5.x names it activation_checkpointing_*; older ones gradient_checkpointing_*
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    elif hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def _checkpointing(model: torch.nn.Module, on: bool) -> Iterator[None]:
    """Checkpointing for the update only (the live model also samples, uncheckpointed)."""
    if not on:
        yield
        return
    set_checkpointing(model, True)
    try:
        yield
    finally:
        set_checkpointing(model, False)


def _autocast(cfg: UpdateConfig, device: torch.device) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16) if cfg.autocast_bf16 else contextlib.nullcontext()
