"""Stage (7) of a TRACE iteration: the policy update on the iteration's verified trees.

The update trains the weights of its input checkpoint (policy version v, ``stages.versions``).
In the synchronous flow the trees came from those same weights; in the pipeline
(``run.max_staleness`` = S > 0) from up to S versions before, and the update refuses older
trajectories and corrects the rest with their behaviour log-probs (``policy.update``).
"""

from __future__ import annotations

import time

import polars as pl

from trace_core.allocation import get_strategy
from trace_core.config import TrainConfig
from trace_core.home.shards import read_shard
from trace_core.policy.checkpoint import has_trainer_state, load_checkpoint, save_checkpoint
from trace_core.policy.distributed import UpdateJob, launch_update
from trace_core.policy.update import build_sequences, make_optimizer, reference_policy
from trace_core.policy.update import update_policy as clipped_update
from trace_core.runtime import Runtime
from trace_core.stages.prompt_pools import tasks_by_id
from trace_core.stages.results import PolicyUpdate, Verified
from trace_core.stages.run import RunRef, bounded_seed, initial_checkpoint, iteration_seed, seed_torch
from trace_core.stages.versions import checkpoint_version, stale_trajectories, staleness


def update_policy(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, verified: Verified,
                  runtime: Runtime) -> PolicyUpdate:
    """(7) One clipped-surrogate update on the iteration's trees; save the next checkpoint. The
    update trains the weights of ``checkpoint``'s version v: trajectories generated more than
    ``run.max_staleness`` versions before v are refused, and with S > 0 the rest are corrected
    for the gap (``update.off_policy``, ``policy.update``)."""
    t0 = time.perf_counter()
    # a retry starts from the input checkpoint, not from weights a failed attempt partly updated:
    # with trainer state, load_checkpoint below restores them; without (iteration 0), reload here
    pol = runtime.policy(checkpoint, fresh=not has_trainer_state(checkpoint))
    nodes = read_shard(verified.nodes)
    tasks, envs = tasks_by_id(cfg, iteration), runtime.envs
    messages = {p: envs[tasks[p].family].reset(tasks[p]).messages() for p in nodes["prompt_id"].unique()}
    skip = get_strategy(cfg.allocation.strategy).drop_zero_variance or (
        cfg.update.skip_zero_advantage and not cfg.update.uses_reference)  # with KL, A = 0 sequences still train
    version, max_staleness = checkpoint_version(ref, checkpoint), cfg.run.max_staleness
    refused = stale_trajectories(nodes, version, max_staleness)
    seqs = [s for s in build_sequences(nodes, pol.chat, messages, skip_zero_advantage=skip)
            if s.trajectory_id not in refused]
    correct = max_staleness > 0 and cfg.update.off_policy == "decoupled"
    out, seed = ref.checkpoint(iteration), iteration_seed(cfg, iteration, "update")
    reference = initial_checkpoint(cfg) if cfg.update.uses_reference else None  # KL to the warm-start policy
    pol.engine.sleep()  # a colocated vLLM engine frees the GPU for the trainer; a no-op for hf
    if cfg.update.strategy != "single" and seqs:  # torchrun ranks read the inputs from files, rank 0 saves
        job = UpdateJob(checkpoint=checkpoint, out=str(out), reference=reference, update=cfg.update, seed=seed,
                        torch_seed=bounded_seed(seed), pad_id=pol.tokenizer.pad_token_id,
                        cursor={"iteration": iteration + 1}, threads=cfg.run.threads, correct=correct)
        stats = launch_update(job, seqs, ref.staging(iteration, "update").with_suffix(".job"))
    else:
        optimizer, scheduler = make_optimizer(pol.model, cfg.update)
        if has_trainer_state(checkpoint):  # continue the optimizer of the last update
            load_checkpoint(checkpoint, pol.model, optimizer=optimizer, scheduler=scheduler, restore_rng=False)
        seed_torch(bounded_seed(seed))  # not amid a predictor fit's draws (the pipeline runs one beside it)
        ref_model = reference_policy(reference, str(next(pol.model.parameters()).device)) if reference else None
        stats = clipped_update(pol.model, optimizer, scheduler, seqs, cfg.update, pad_id=pol.tokenizer.pad_token_id,
                               seed=seed, ref_model=ref_model, correct=correct)
        save_checkpoint(out, pol.model, optimizer=optimizer, scheduler=scheduler, tokenizer=pol.tokenizer,
                        cursor={"iteration": iteration + 1})
    pol.engine.wake()  # the next stage loads the new weights into it (policy.live.LivePolicy.get)
    lag_mean, lag_max = staleness(nodes.filter(~pl.col("trajectory_id").is_in(list(refused))), version)
    return PolicyUpdate(checkpoint=str(out), stats=stats, version=version, staleness_mean=lag_mean,
                        staleness_max=lag_max, refused=len(refused), seconds=time.perf_counter() - t0)
