"""Settings of the ``data`` section (local dataset files, ``trace_core.envs.datasets``): pure pydantic.

Plain data: loader names are checked against the registry in ``trace_core.envs.loaders`` once,
at start (``trace_core.runtime.check_names``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DatasetFile(BaseModel):
    """One local dataset file and how to read it."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(..., min_length=1, description="Local file (.jsonl / .json / .parquet) or BFCL data "
                      "directory; a relative path is taken from the working directory, else from the checkout.")
    loader: str = Field(..., description="Format: gsm8k, math, hotpotqa, musique, xlam or bfcl "
                        "(trace_core.envs.loaders).")
    weight: float = Field(1.0, gt=0, le=1e6, description="Mixing weight: the file's share of each candidate "
                          "pool is proportional to it (training files only).")
    limit: int | None = Field(None, ge=1, le=10_000_000, description="Read at most this many tasks of the file.")
    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$",
                             description="Prefix of the prompt ids ('{name}:{id}'); default the file stem.")
    options: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Extra loader arguments, e.g. {category: simple_python} for bfcl.")

    @property
    def label(self) -> str:
        return self.name or Path(self.path).stem


class DataConfig(BaseModel):
    """Training and held-out prompts from local dataset files (empty ``train``: synthetic tasks)."""

    model_config = ConfigDict(extra="forbid")

    train: list[DatasetFile] = Field(default_factory=list, description="Training files with mixing weights; "
                                     "empty = the synthetic generators (env.families / env.difficulties).")
    heldout: list[DatasetFile] = Field(default_factory=list,
                                       description="Held-out files for accuracy (run.eval_tasks of their rows).")
    heldout_share: float = Field(0.0, ge=0.0, le=0.9, description="Without heldout files: this share of every "
                                 "training file is held out (fixed split by prompt-id hash).")
    corpus: Literal["dataset", "task"] = Field(
        "dataset", description="QA search corpus: 'dataset' = every paragraph of every QA row; 'task' = each "
        "question's own paragraphs.")
    on_bad_row: Literal["skip", "error"] = Field("skip", description="A bad record: report it (file and line) "
                                                 "and skip it, or stop the run.")

    @property
    def enabled(self) -> bool:
        return bool(self.train)
