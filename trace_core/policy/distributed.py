"""The policy update on many processes: FSDP2 or DDP over ``torchrun``, one rank per GPU.

The run's process writes the update's inputs to a job directory and launches::

    python -m torch.distributed.run --standalone --nproc-per-node W -m trace_core.policy.distributed JOB_DIR

    JOB_DIR/job.json            UpdateJob: input checkpoint, output path, reference, UpdateConfig, seeds
    JOB_DIR/batch.safetensors   the training sequences, flattened (never a pickle; removed after success)
    JOB_DIR/result.json         written by rank 0: the update's metrics (``UpdateStats``, as ``update_policy`` returns)
    JOB_DIR/worker.log          the processes' output

Every rank reads the whole batch and draws the same minibatches; rank r trains on its share of
each (``update.update_policy`` with ``rank`` / ``world_size``), so the loss and the step are the
one-process update's up to float summation order (tested with 2 gloo processes on CPU). ``fsdp``
shards parameters, gradients and AdamW moments with ``fully_shard`` per decoder block plus the
root; ``ddp`` replicates the model. Rank 0 gathers the full state dict (CPU offloaded) and writes
the same checkpoint as the one-process update: ``save_pretrained`` weights + trainer state, the
optimizer state keyed by parameter index as ``torch.optim.Optimizer.state_dict`` keys it, so
either path continues the other's optimizer.

Loading: with ``fsdp`` only rank 0 reads the checkpoint (on CPU); the other ranks build the model
on the meta device and receive their shards by broadcast, so the host holds one full copy of the
fp32 weights, not W. ``ddp`` ranks each load the whole model (it fits, by choice of strategy).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors import safe_open
from safetensors.torch import save_file

from trace_core.policy.checkpoint import STATE_FILE, has_trainer_state, load_trainer_state, save_checkpoint
from trace_core.policy.config import UpdateConfig
from trace_core.policy.model import load_policy
from trace_core.policy.update import (
    TrainSequence,
    make_optimizer,
    set_checkpointing,
    token_logprobs,
    update_policy,
)
from trace_core.stages.results import UpdateStats

JOB, BATCH, RESULT, LOG = "job.json", "batch.safetensors", "result.json", "worker.log"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class UpdateJob(BaseModel):
    """What a distributed update needs besides its batch (``job.json``)."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(description="Input checkpoint directory (weights; trainer state if it has one).")
    out: str = Field(description="Where rank 0 writes the new checkpoint.")
    reference: str | None = Field(None, description="Reference policy of the KL term (used when update.uses_reference).")
    update: UpdateConfig
    seed: int = Field(0, ge=0, description="Minibatch order (as update_policy's seed).")
    torch_seed: int = Field(0, ge=0, description="torch.manual_seed before the update.")
    pad_id: int = Field(ge=0)
    cursor: dict[str, Any] = Field(default_factory=dict, description="Saved with the trainer state.")
    threads: int | None = Field(None, ge=0, le=1024, description="torch CPU threads per rank (run.threads: "
                                "0 or None = torch's default, one OpenMP thread).")
    correct: bool = Field(False, description="Off-policy correction (update.off_policy; the pipeline's stale rollouts).")


# ----------------------------------------------------------------------------- batch file
def write_batch(seqs: Sequence[TrainSequence], path: str | Path) -> Path:
    """The sequences as flat tensors + offsets in one safetensors file (``collate`` gives the same
    tensors from them as from ``seqs``)."""
    lens = [len(s.input_ids) for s in seqs]
    offsets = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0)

    def flat(attr: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([v for s in seqs for v in getattr(s, attr)], dtype=dtype).reshape(-1)

    # float32 as ``collate`` feeds the loss (13 bytes a token: ~0.2 GB for 2,048 x 8k-token trajectories)
    save_file({"offsets": offsets, "input_ids": flat("input_ids", torch.int32),
               "loss_mask": flat("loss_mask", torch.int8), "advantages": flat("advantages", torch.float32),
               "old_logprobs": flat("old_logprobs", torch.float32)}, str(path),
              metadata={"trajectory_ids": json.dumps([s.trajectory_id for s in seqs])})
    return Path(path)


def read_batch(path: str | Path) -> list[TrainSequence]:
    """The sequences of ``write_batch``; ``ValueError`` (one line) for a malformed file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            t = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
            ids = json.loads((f.metadata() or {})["trajectory_ids"])
        off = t["offsets"].tolist()
        n = len(off) - 1
        sizes = {k: t[k].numel() for k in ("input_ids", "loss_mask", "advantages", "old_logprobs")}
        if off[0] != 0 or any(b < a for a, b in zip(off, off[1:], strict=False)) or set(sizes.values()) != {off[-1]} \
                or len(ids) != n:
            raise ValueError(f"offsets {off[:3]}..{off[-1:]} do not fit the columns {sizes} / {len(ids)} ids")
    except Exception as err:
        raise ValueError(f"{path}: not a batch written by write_batch ({err})") from None
    cols = {k: t[k].tolist() for k in sizes}
    return [TrainSequence(cols["input_ids"][a:b], cols["loss_mask"][a:b], cols["advantages"][a:b],
                          cols["old_logprobs"][a:b], str(ids[i]))
            for i, (a, b) in enumerate(zip(off, off[1:], strict=False))]


# ----------------------------------------------------------------------------- launcher (run's process)
def launch_update(job: UpdateJob, seqs: Sequence[TrainSequence], job_dir: str | Path) -> UpdateStats:
    """Run the update on ``job.update.world_size`` torchrun processes; returns rank 0's metrics.

    The whole process group is stopped on timeout or interrupt; a failed run raises with the
    log's last line."""
    if torch.cuda.is_available() and job.update.world_size > torch.cuda.device_count():
        raise ValueError(f"update.world_size={job.update.world_size} but this machine has "
                         f"{torch.cuda.device_count()} GPU(s): one rank per GPU")
    job_dir = Path(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    write_batch(seqs, job_dir / BATCH)
    (job_dir / JOB).write_text(job.model_dump_json(indent=1))
    (job_dir / RESULT).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={job.update.world_size}", "-m", "trace_core.policy.distributed", str(job_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": str(job.threads or 1),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    with open(job_dir / LOG, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=job.update.launch_timeout_s)
        except BaseException:  # timeout, SIGINT/SIGTERM of the run: no rank outlives it
            _stop_group(proc)
            raise
    if rc != 0 or not (job_dir / RESULT).is_file():
        tail = [ln for ln in (job_dir / LOG).read_text(errors="replace").splitlines() if ln.strip()][-1:]
        raise RuntimeError(f"distributed update failed (exit {rc}, log {job_dir / LOG}): {' '.join(tail)}")
    (job_dir / BATCH).unlink()  # job.json, result.json and the log stay as the update's record
    return UpdateStats.model_validate_json((job_dir / RESULT).read_text())


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


# ----------------------------------------------------------------------------- worker (each rank)
class TokenLogProbs(torch.nn.Module):
    """A causal LM's (B, L) token log-probs as one module: the root FSDP / DDP wrap, so that the
    chunked log-softmax (which calls the decoder and the head separately) runs inside its forward."""

    def __init__(self, lm: torch.nn.Module, cfg: UpdateConfig) -> None:
        super().__init__()
        self.lm, self.temperature, self.chunk = lm, cfg.temperature, cfg.logprob_chunk

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return token_logprobs(self.lm, {"input_ids": input_ids, "attention_mask": attention_mask},
                              self.temperature, self.chunk)


def _wrap(path: str, cfg: UpdateConfig, device: torch.device, *, train: bool) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel


    fsdp, rank = cfg.strategy == "fsdp", torch.distributed.get_rank()
    lm = load_policy(path)[0] if rank == 0 or not fsdp else _empty_lm(path)
    if not train:
        lm.requires_grad_(False).eval()
    elif cfg.gradient_checkpointing:
        set_checkpointing(lm, True)
    module = TokenLogProbs(lm, cfg)
    if fsdp:
        return _shard(module, device)
    module.to(device)
    if not train:
        return module
    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)


def _empty_lm(path: str) -> torch.nn.Module:
    """The checkpoint's architecture on the meta device (no memory): ranks > 0 of an FSDP update
    receive their shards from rank 0 instead of each reading the whole checkpoint."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):  # float32 as load_policy casts it
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path, local_files_only=True),
                                                dtype=torch.float32)


def _shard(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """FSDP2 units: each decoder block, then the root (embeddings, final norm, tied head). Rank 0
    holds the loaded weights; the others allocate their shards and get the values broadcast."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank = dist.get_rank()
    full = module.state_dict() if rank == 0 else {}  # keeps rank 0's full tensors alive past sharding
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in module.lm.get_decoder().layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    if rank != 0:
        module.to_empty(device=device)
    set_model_state_dict(module, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for buf in module.buffers():  # rotary tables are not in the state dict (non-persistent)
        dist.broadcast(buf, src=0)
    return module


def _param_names(module: torch.nn.Module) -> list[str]:
    """Trainable parameter names in ``make_optimizer``'s order (the optimizer's integer ids)."""
    inner = getattr(module, "module", module)  # DDP
    return [n for n, p in inner.named_parameters() if p.requires_grad]


def _by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}


def _by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: v for n, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]}


class _SavedOptimizer:
    """An optimizer state as ``save_checkpoint`` asks for it (``.state_dict()``)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def _restore_trainer(job: UpdateJob, module: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict


    if not has_trainer_state(job.checkpoint):
        return
    trainer = load_trainer_state(Path(job.checkpoint) / STATE_FILE)
    if trainer["optimizer"] is not None and trainer["optimizer"]["state"]:
        set_optimizer_state_dict(module, opt, _by_name(trainer["optimizer"], _param_names(module)),
                                 options=StateDictOptions(full_state_dict=True))
    if trainer["scheduler"] is not None:
        sched.load_state_dict(trainer["scheduler"])


def _save(job: UpdateJob, module: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, rank: int) -> None:
    """Gather the full weights and optimizer state (collective); rank 0 writes the checkpoint."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(module, options=full)
    optim = get_optimizer_state_dict(module, opt, options=full)
    if rank != 0:
        return
    weights = {k.removeprefix("module.").removeprefix("lm."): v for k, v in weights.items()}
    names = _param_names(module)
    optim = _by_index({"state": optim["state"], "param_groups": optim["param_groups"]}, names)
    with torch.device("meta"):  # a shell for save_pretrained: the gathered tensors are assigned into it
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(job.checkpoint, local_files_only=True),
                                              dtype=next(iter(weights.values())).dtype)
    lm.load_state_dict(weights, strict=False, assign=True)
    if getattr(lm.config, "tie_word_embeddings", False):
        lm.tie_weights()
    save_checkpoint(job.out, lm, optimizer=_SavedOptimizer(optim), scheduler=sched, cursor=job.cursor,
                    tokenizer=AutoTokenizer.from_pretrained(job.checkpoint, local_files_only=True))


def run_worker(job_dir: str | Path) -> None:
    """One rank of the update (``torchrun`` sets RANK, WORLD_SIZE, LOCAL_RANK)."""
    import torch.distributed as dist


    job_dir = Path(job_dir)
    job = UpdateJob.model_validate_json((job_dir / JOB).read_text())
    seqs = read_batch(job_dir / BATCH)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if job.threads:
        torch.set_num_threads(job.threads)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        t0 = time.perf_counter()
        policy = _wrap(job.checkpoint, job.update, device, train=True)
        ref = (_wrap(job.reference, job.update, device, train=False)
               if job.reference and job.update.uses_reference else None)
        opt, sched = make_optimizer(policy, job.update)
        _restore_trainer(job, policy, opt, sched)
        torch.manual_seed(job.torch_seed)
        stats = update_policy(policy, opt, sched, seqs, job.update, pad_id=job.pad_id, seed=job.seed,
                              logprobs=lambda b: policy(b["input_ids"], b["attention_mask"]),
                              ref_logprobs=(lambda b: ref(b["input_ids"], b["attention_mask"])) if ref else None,
                              rank=rank, world_size=world, correct=job.correct)
        _save(job, policy, opt, sched, rank)
        if rank == 0:
            stats = stats.model_copy(update={"world_size": float(world), "total_seconds": time.perf_counter() - t0})
            tmp = job_dir / f".{RESULT}.tmp"
            tmp.write_text(stats.model_dump_json(exclude_none=True))
            tmp.rename(job_dir / RESULT)
        dist.barrier()  # no rank tears its gloo pairs down while another still uses them (an abort at exit)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: torchrun --nproc-per-node W -m trace_core.policy.distributed JOB_DIR")
    run_worker(sys.argv[1])
