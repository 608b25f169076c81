"""``trace-rl plan``: the capacity plan of a run config as text (formulas in ``trace_core.analysis.capacity``).

Where things run is read from the config: the update on ``update.world_size`` GPUs (one rank each;
``single``: the flow's GPU); vLLM either colocated with the flow on GPU 0 (``run.rollout_workers:
0``; it sleeps during the update when ``vllm.enable_sleep_mode``) or in Ray workers on GPUs of their
own (``rollout_workers`` x ``tensor_parallel_size``, the README's GPU pool). A GPU fits when the
update's peak plus what the engine keeps there stays within it, and the engine's KV cache holds at
least one ``max_model_len`` sequence (vLLM refuses to start otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trace_core.analysis.capacity import (
    GIB,
    PROMPT_TOKENS,
    SLEEP_RESIDUE_GIB,
    VLLM_RESERVE_GIB,
    engine_memory,
    model_shape,
    seq_len,
    update_memory,
)
from trace_core.config import TrainConfig


@dataclass
class Plan:
    text: str
    fits: bool


def _gib(b: float) -> str:
    return f"{b / GIB:8.1f} GiB"


def plan(cfg: TrainConfig, *, gpu_gib: float = 80.0, source: str = "config") -> Plan:
    shape, where = model_shape(cfg)
    u, gpu = cfg.update, gpu_gib * GIB
    world = u.world_size if u.strategy != "single" else 1
    length = seq_len(cfg)
    tokens = u.micro_batch_size * length
    act_bytes = 2 if u.autocast_bf16 else 4
    mem = update_memory(shape, tokens=tokens, micro_batch=u.micro_batch_size, world_size=world, strategy=u.strategy,
                        checkpointing=u.gradient_checkpointing, chunk=u.logprob_chunk, act_bytes=act_bytes)
    vllm = cfg.run.engine == "vllm"
    colocated = vllm and cfg.run.rollout_workers == 0
    eng = engine_memory(shape, cfg, gpu) if vllm else None
    out = [f"capacity plan: {source}",
           f"model: {shape.params / 1e9:.2f}B parameters ({shape.layers} layers x {shape.hidden}, "
           f"{shape.heads}/{shape.kv_heads} heads x {shape.head_dim}, FFN {shape.intermediate}, vocabulary "
           f"{shape.vocab:,}, {'tied' if shape.tied else 'untied'} embeddings) from {where}"]
    if colocated:
        topo = f"vLLM colocated on GPU 0 ({'sleeps' if cfg.vllm.enable_sleep_mode else 'stays awake'} during the update)"
        gpus = world
    elif vllm:
        per = cfg.vllm.tensor_parallel_size
        topo = f"vLLM in {cfg.run.rollout_workers} Ray worker(s) on {per} GPU(s) each"
        gpus = world + cfg.run.rollout_workers * per
    else:
        topo, gpus = "hf engine (no vLLM)", world
    out.append(f"GPUs: {gpus} x {gpu_gib:g} GiB; update {u.strategy} on {world}, {topo}")
    out += ["", f"update, per GPU ({u.strategy} over {world}; micro-batch {u.micro_batch_size} x {length:,} tokens; "
                f"checkpointing {'on' if u.gradient_checkpointing else 'off'}; log-prob chunk "
                f"{u.logprob_chunk or 'off'}):"]
    out += [f"  {name:<30}{_gib(b)}" for name, b in mem.terms.items()]
    beside = 0.0
    if colocated:
        beside = SLEEP_RESIDUE_GIB * GIB if cfg.vllm.enable_sleep_mode else eng.budget
        out.append(f"  {'+ vLLM on GPU 0 meanwhile':<30}{_gib(beside)}")
    update_fits = mem.peak + beside <= gpu
    out.append(f"  {'peak':<30}{_gib(mem.peak + beside)}  of {gpu_gib:g} GiB: {'fits' if update_fits else 'DOES NOT FIT'}")
    engine_fits = True
    if eng is not None:
        max_len = cfg.vllm.max_model_len or cfg.model.max_position_embeddings
        seqs = eng.kv_tokens / max_len
        engine_fits = eng.kv_tokens >= max_len
        out += ["", f"vLLM engine, per GPU (tensor parallel {cfg.vllm.tensor_parallel_size}; gpu_memory_utilization "
                    f"{cfg.vllm.gpu_memory_utilization:g} of {gpu_gib:g} GiB):",
                f"  {'share':<30}{_gib(eng.budget)}",
                f"  {'weights (' + cfg.model.dtype + ')':<30}{_gib(eng.weights)}",
                f"  {'activations reserve':<30}{_gib(eng.reserve)}",
                f"  {'KV cache':<30}{_gib(max(eng.kv_cache, 0))}  = {eng.kv_tokens:,} tokens at "
                f"{eng.kv_per_token / 1024:.0f} KiB/token = {seqs:.1f} sequences of max_model_len {max_len:,}: "
                f"{'fits' if engine_fits else 'DOES NOT FIT (vLLM needs one)'}"]
    out += ["", *_tokens(cfg, length, world)]
    out += ["", "assumptions:", *[f"  - {a}" for a in _assumptions(cfg, length)]]
    fits = update_fits and engine_fits
    out += ["", f"fits: {'yes' if fits else 'no'} ({gpus} GPU(s) of {gpu_gib:g} GiB)"]
    return Plan("\n".join(out), fits)


def _tokens(cfg: TrainConfig, length: int, world: int) -> list[str]:
    a, u, e = cfg.allocation, cfg.update, cfg.env
    per_traj = min(e.max_turns * cfg.sampling.max_new_tokens, e.max_tokens_per_episode)
    steps = math.ceil(a.budget_total / u.minibatch_size) * u.ppo_epochs
    micro = math.ceil(min(u.minibatch_size, a.budget_total) / (world * u.micro_batch_size))
    evals = cfg.run.eval_tasks * cfg.run.eval_samples
    every = cfg.run.eval_every or cfg.run.iterations
    return ["tokens per iteration (upper bounds):",
            f"  generated: {a.budget_total:,} trajectories x {per_traj:,} = {a.budget_total * per_traj:,}",
            f"  update: {a.budget_total:,} sequences x {length:,} = {a.budget_total * length:,} tokens; "
            f"{steps} optimizer step(s) of {micro} micro-batch(es) per GPU",
            f"  held-out: {evals:,} episodes every {every} iteration(s), up to {evals * per_traj:,} generated tokens"]


def _assumptions(cfg: TrainConfig, length: int) -> list[str]:
    u = cfg.update
    return [
        f"sequence = {PROMPT_TOKENS} prompt tokens + env.max_tokens_per_episode, within vllm.max_model_len / "
        f"model.max_position_embeddings: {length:,} tokens",
        "the update trains float32 weights with float32 AdamW moments whatever model.dtype (the checkpoint is cast "
        "on load): 4 + 4 + 8 B a parameter, plus 4 B of foreach temporaries during optimizer.step",
        "activations " + ("bf16 (update.autocast_bf16)" if u.autocast_bf16 else "float32") + " as counted from "
        "autograd's saved tensors of a Qwen3 block; attention flash-style (no sequence-squared term)",
        "log-prob peak: three float32 positions x vocabulary tensors at once (logits, scaled, log-probs / grads)",
        "FSDP2 working set: the root unit (embeddings, head, final norm) unsharded through forward and backward, "
        "with its gradients, plus two blocks and one block's gradients; DDP: gradient buckets of 4 B a parameter",
        f"vLLM: weights in model.dtype split over tensor_parallel_size, {VLLM_RESERVE_GIB:g} GiB of its share for "
        f"activations and CUDA graphs, the rest KV cache (K and V of every layer in model.dtype)",
        f"a sleeping colocated vLLM still holds {SLEEP_RESIDUE_GIB:g} GiB; nothing else of the run on a GPU",
        "CUDA context and allocator fragmentation (~1-2 GiB a process) are not counted: keep that much free",
        "host RAM (not GPU): fsdp rank 0 holds the full float32 weights while sharding and gathers the full "
        f"weights and AdamW moments to save: ~{16 * model_shape(cfg)[0].params / GIB:.0f} GiB on the head node",
    ]
