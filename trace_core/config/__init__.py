"""The run configuration: one pydantic model per concern, composed into ``TrainConfig``.

YAML files in ``configs/`` map 1:1 onto ``TrainConfig`` (sections ``run``, ``model``, ``env``,
``sampling``, ``allocation``, ``predictor``, ``update``, ``warmup``, ``tracking``, ``ray``); every field
is documented once, in its own module. ``--set a.b=value`` overrides any field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trace_core.advantages.config import AdvantageConfig
from trace_core.allocation.config import AllocationConfig
from trace_core.config.io import load_config
from trace_core.config.tracking import TrackingConfig
from trace_core.engines.config import RayConfig, SamplingConfig, VLLMConfig
from trace_core.envs.config import EnvConfig
from trace_core.envs.datasets_config import DataConfig
from trace_core.policy.config import ModelConfig, UpdateConfig, WarmupConfig
from trace_core.predictor.config import PredictorConfig


class RunConfig(BaseModel):
    """What one training run iterates over and where its prompts come from."""

    model_config = ConfigDict(extra="forbid")

    iterations: int = Field(5, ge=1, le=100_000, description="Training iterations (one allocation + update each).")
    seed: int = Field(0, ge=0, le=2**31 - 1,  # torch, numpy and Python's random all take it; compare adds seed offsets
                      description="Run seed: prompt stream, sampling and update all derive from it (0 to 2^31 - 1).")
    engine: str = Field("hf", description="Registered rollout engine (trace_core.engines): 'hf' (CPU/GPU), "
                        "'vllm' (GPU worker).")
    # bounds: building a prompt costs ~0.3-0.9 ms and ~2 KB on the CI CPU, so 1M prompts (the
    # size of the largest public RL prompt sets) is ~2 GB and minutes, built once; 10M never starts
    train_prompts: int = Field(
        1024, ge=0, le=1_000_000,
        description="Size of the fixed training prompt set the candidate pools are drawn from (prompts recur "
        "across iterations, as in a real dataset, so the predictor's per-prompt history applies); "
        "0 = a fresh synthetic pool every iteration.")
    candidate_pool: int = Field(  # <= 100k: scored every iteration (~0.2 GB, about a minute on CPU)
        96, ge=1, le=100_000,
        description="Candidate prompts scored per iteration; larger than budget/group_size so that "
        "root allocation can choose (scoring is cheap, sampling is not).")
    eval_tasks: int = Field(48, ge=0, le=100_000, description="Held-out prompts per accuracy evaluation (0 = off).")
    eval_samples: int = Field(2, ge=1, le=64, description="Samples per held-out prompt (accuracy = mean reward).")
    eval_every: int = Field(
        0, ge=0, le=100_000, description="Evaluate every k iterations (0 = only before the first and after the last).")
    probe_tasks: int = Field(
        0, ge=0, le=100_000,
        description="Training prompts re-scored at every evaluation (a fixed sample of the training stream, "
        "eval_samples each): rising probe but flat held-out accuracy means 'not generalising', both flat "
        "means 'not learning'. 0 = off.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Torch device for generation and updates.")
    threads: int = Field(0, ge=0, le=1024, description="torch.set_num_threads on CPU (0 = leave torch's default).")
    rollout_workers: int = Field(
        0, ge=0, le=4096,
        description="Rollout workers (Ray actors, settings in `ray`) that raw rollouts, extensions and evaluation "
        "are sharded over; 0 = generate in the flow's own process.")
    stage_timeout_s: float | None = Field(
        None, gt=0,
        description="Seconds a generation (raw rollouts, extensions) or policy-update stage may run before it "
        "fails with a timeout, which is not retried (None = no limit). Size it well above the slowest "
        "normal iteration: it is there to end a hung engine or collective, not to pace training.")
    max_staleness: int = Field(
        0, ge=0, le=64,
        description="Policy versions the rollouts may run behind the update (the asynchronous pipeline): with S > 0 "
        "the rollout side of iteration i (predictor refresh to reward verification) runs while the update of "
        "iteration i - 1 trains, on the weights of version max(0, i - S), and the update corrects for the gap "
        "(update.off_policy). 0 = the synchronous flow: every iteration's rollouts use the newest weights.")
    keep_checkpoints: int | None = Field(
        None, ge=1, le=100_000,
        description="Iteration checkpoints (weights + optimizer state) kept, newest first; older ones are retired "
        "(files removed, RETIRED.json left) once a newer iteration is recorded. None = keep all. 1 is enough "
        "to resume after a crash; recomputing a lost output of iteration i needs checkpoint i-1.")
    keep_best_checkpoint: bool = Field(
        True, description="With keep_checkpoints set, also keep the checkpoint with the best held-out accuracy.")

    @property
    def flow_engine(self) -> str:
        """The engine the flow's own process holds. Without rollout workers it generates: ``engine``.
        With them it only trains and the workers hold ``engine``; its policy holds ``hf``, a view of
        the trainer's model (no memory of its own; its sleep / wake around the update are no-ops)."""
        return "hf" if self.rollout_workers else self.engine


class TrainConfig(BaseModel):
    """A whole training run. Sections are documented in their own modules."""

    model_config = ConfigDict(extra="forbid")

    run: RunConfig = Field(default_factory=RunConfig, description="Iterations, seed, engine, prompt pool.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model (trace_core.policy.model).")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environments (trace_core.envs.config).")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Per-turn sampling.")
    allocation: AllocationConfig = Field(default_factory=AllocationConfig,
                                         description="Strategy and budget (trace_core.allocation).")
    predictor: PredictorConfig = Field(default_factory=PredictorConfig, description="Success predictor.")
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig, description="Advantage estimator.")
    update: UpdateConfig = Field(default_factory=UpdateConfig, description="Policy update (trace_core.policy.update).")
    warmup: WarmupConfig = Field(default_factory=WarmupConfig, description="SFT warm start (trace-rl warmup).")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow tracking.")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings (run.engine=vllm).")
    data: DataConfig = Field(default_factory=DataConfig,
                             description="Training / held-out prompts from local dataset files (trace_core.envs.datasets).")
    ray: RayConfig = Field(default_factory=RayConfig, description="Rollout workers on Ray (trace_core.engines.pool).")

    @model_validator(mode="after")
    def _heldout_for_data(self) -> TrainConfig:
        d = self.data
        if d.train and self.run.eval_tasks and not d.heldout and d.heldout_share == 0:
            raise ValueError("data.train is set but there is no held-out split: set data.heldout, "
                             "data.heldout_share > 0 or run.eval_tasks=0")
        return self

    @model_validator(mode="after")
    def _reference_on_the_rollouts_policy(self) -> TrainConfig:
        if self.predictor.reference.enabled and self.run.max_staleness > 0:
            raise ValueError("predictor.reference.enabled scores demonstrations with the flow's policy, which a "
                             "pipelined run (run.max_staleness > 0) keeps for the update: set one of them off")
        if self.predictor.history_shift.enabled and self.run.max_staleness > 0:
            raise ValueError("predictor.history_shift.enabled scores earlier trajectories with the flow's policy, "
                             "which a pipelined run (run.max_staleness > 0) keeps for the update: set one of them off")
        return self


def load_train_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    return load_config(TrainConfig, path, overrides)
