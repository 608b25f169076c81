"""Save and load a fitted predictor without pickle: one safetensors file.

The file holds the head's ``state_dict`` as tensors and, in the safetensors header metadata
(strings), the ``PredictorConfig`` as JSON and the fitted state as JSON: base rates, the prior's
outcome counts and strengths, the calibration maps, the flip model. Loading rebuilds the predictor
through the registry (``make_predictor(config)``) and fills that state; nothing in the file is
executed. A file that is not safetensors (an old ``torch.save`` pickle: a zip or a raw pickle
stream) is refused with a one-line ``ValueError`` and never unpickled.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import polars as pl
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trace_core.predictor.base import make_predictor
from trace_core.predictor.calibration import TRACK_SCHEMA, map_from_state
from trace_core.predictor.config import PredictorConfig
from trace_core.predictor.flip import FlipModel
from trace_core.predictor.model import SuccessHead
from trace_core.predictor.prior import COUNTS_SCHEMA, HierarchicalPrior
from trace_core.predictor.reference import ReferenceTerm

FORMAT = "trace-rl-predictor/1"
_MAX_HEADER = 100_000_000


def predictor_state(pred) -> dict:
    """The fitted state of a ``HashedPredictor`` (or subclass) as plain JSON data."""
    return {
        "base_rate": pred.base_rate,
        "last_iteration": pred.last_iteration,
        "calibrators": {k: m.to_state() for k, m in pred.calibrators.items()},
        "prior_maps": {k: m.to_state() for k, m in pred.prior_maps.items()},
        "prior": pred.prior.state(),
        "cell_prior": pred.cell_prior.to_dict(as_series=False),
        "flip": pred.flip.state(),
        "reference": pred.reference.state(),
        "track": pred.track.to_dict(as_series=False),
        "head_shape": list(pred.head.shape) if pred.head is not None else None,
    }


def save_predictor(pred, path: str | Path) -> Path:
    """Write ``pred`` to ``path`` atomically (temporary name, then rename)."""
    path = Path(path)
    tensors = {k: v.detach().contiguous().cpu() for k, v in pred.head.state_dict().items()} if pred.head else {}
    meta = {"format": FORMAT, "config": pred.config.model_dump_json(), "state": json.dumps(predictor_state(pred))}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def _check_format(path: Path) -> None:
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and 0 < struct.unpack("<Q", head[:8])[0] < _MAX_HEADER and head[8:9] == b"{":
        return  # a safetensors header: 8-byte little-endian length, then JSON
    if head[:2] == b"PK" or head[:1] == b"\x80":  # torch.save zip archive / raw pickle stream
        raise ValueError(f"{path}: an old pickled predictor; refusing to unpickle it (unsafe) - refit to replace it")
    raise ValueError(f"{path}: not a saved predictor (expected a safetensors file written by save())")


def load_predictor(path: str | Path):
    """The predictor saved at ``path`` (see the module docstring); ``ValueError`` for anything else."""
    path = Path(path)
    _check_format(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    pred = make_predictor(PredictorConfig.model_validate_json(meta["config"]))
    load_state(pred, json.loads(meta["state"]), tensors)
    return pred


def load_state(pred, state: dict, tensors: dict[str, torch.Tensor]) -> None:
    cfg = pred.config
    pred.base_rate = {k: float(v) for k, v in state["base_rate"].items()}
    pred.last_iteration = int(state["last_iteration"])
    pred.calibrators = {k: map_from_state(s) for k, s in state["calibrators"].items()}
    pred.prior_maps = {k: map_from_state(s) for k, s in state["prior_maps"].items()}
    pred.prior = HierarchicalPrior.from_state(cfg.prior, state["prior"])
    pred.cell_prior = pl.DataFrame(state["cell_prior"], schema=COUNTS_SCHEMA)
    pred.flip = FlipModel.from_state(cfg.flip, state["flip"])
    pred.track = pl.DataFrame(state["track"], schema=TRACK_SCHEMA)
    pred.reference = ReferenceTerm.from_state(state.get("reference"))  # absent in files from before the term
    pred.head = None
    if state["head_shape"] is not None:
        head = SuccessHead(*(int(x) for x in state["head_shape"]))
        head.load_state_dict(tensors)
        pred.head = head.eval()

