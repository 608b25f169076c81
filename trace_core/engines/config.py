"""Settings of the engines, pure pydantic: per-turn sampling, the vLLM engine (``run.engine=vllm``; the
weights dtype is ``model.dtype``) and the Ray rollout workers (``engines.pool``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class VLLMConfig(BaseModel):
    """How ``vllm.LLM`` is built. GPU and CPU builds of vLLM read different memory settings."""

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs one engine shards the model over.")
    gpu_memory_utilization: float = Field(
        0.3, gt=0.0, le=0.95,
        description="GPU build: share of GPU memory vLLM takes for weights and KV cache; colocated with the "
        "trainer, leave the rest to the update (0.3 for 8B with LoRA-free GRPO on 80 GB). Ignored on CPU.")
    cpu_kvcache_gib: int = Field(
        1, ge=1, le=4096,
        description="CPU build: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE); 1 GiB holds ~1M tokens of the "
        "tiny model. Ignored on GPU.")
    max_model_len: int | None = Field(
        None, ge=64, le=1_048_576,
        description="Longest episode (prompt + all turns) in tokens; None = the model's max positions.")
    enforce_eager: bool = Field(
        False,
        description="True: no torch.compile / CUDA graphs. Tiny model on CPU: load 21 s instead of 113 s, but "
        "decoding ~8x slower; use it for tests, not for training.")
    multiprocessing: bool = Field(
        False,
        description="Run vLLM's engine core in a child process (vLLM's default). False keeps the whole engine "
        "in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): no __main__ guard needed, and a Ray actor "
        "holds the engine itself.")
    enable_sleep_mode: bool = Field(
        True,
        description="GPU build: offload weights and drop the KV cache while the colocated trainer updates. "
        "The CPU build has no sleep mode: sleep / wake are no-ops there.")


class SamplingConfig(BaseModel):
    """How one agent turn is sampled."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0, le=5.0,
                               description="Softmax temperature; 0 = greedy (argmax). 1.0 samples the policy itself.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1.0 = off.")
    top_k: int = Field(0, ge=0, le=100_000,
                       description="Keep the k most likely tokens; 0 = off (note: HF generate silently uses 50).")
    max_new_tokens: int = Field(64, ge=1, le=32_768, description="Token limit of one action (one turn).")
    seed: int = Field(
        0, ge=0,
        description="Base seed of one generate call; sample j of a request draws from (seed, request seed, j). "
        "The training stages set it per (iteration, stage) from run.seed, so in a run config it has no "
        "effect: set run.seed instead.")


class RayConfig(BaseModel):
    """Where the rollout workers run (used when ``run.rollout_workers >= 1``)."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None, description="Ray cluster to join ('auto', 'ray://host:10001', 'host:6379'); None = $RAY_ADDRESS if "
        "set, else a local Ray started for the run (ray.init(num_cpus=...)) and shut down after it.")
    num_cpus: int | None = Field(None, ge=1, le=100_000,
                                 description="CPUs of the local Ray (None = max(rollout_workers, os.cpu_count())).")
    cpus_per_worker: float = Field(1.0, ge=0.0, le=1024, description="Ray CPUs each rollout actor reserves.")
    gpus_per_worker: float = Field(0.0, ge=0.0, le=16, description="Ray GPUs each rollout actor reserves (GPU pool: 1).")
    worker_threads: int = Field(1, ge=1, le=1024, description="torch.set_num_threads in each actor (1 per CPU).")
    worker_python: str | None = Field(
        None, description="Interpreter of the workers' own environment (runtime_env py_executable), e.g. "
        "<vllm env>/bin/python; None = the driver's. It needs trace_core and the same Ray version.")
    env_vars: dict[str, str] = Field(default_factory=dict, description="Environment variables of the workers.")
    max_restarts: int = Field(3, ge=0, le=100, description="Dead actors replaced per stage before the stage fails.")
    shards_per_worker: int = Field(
        4, ge=1, le=1024,
        description="Shards a stage is cut into per worker (with >= 2 workers); a worker takes the next one when "
        "it is done, so episodes of unequal length even out (1 = one big batch each, least per-batch cost).")
    start_timeout_s: float = Field(
        600.0, gt=0, description="Seconds the workers may take to start (a cluster without the CPUs/GPUs they "
        "reserve would otherwise wait forever).")
