"""Settings of the vLLM engine (``run.engine=vllm``); the weights dtype is ``model.dtype``."""

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
