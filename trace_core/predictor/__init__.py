"""Success-probability predictors: ``make_predictor(PredictorConfig(...))`` -> fit / predict.

See ``base`` for the protocol and the node-frame convention (roots carry the question in
``action_text``), ``hashed`` for the default predictor (``prior`` + ``model`` + ``calibration`` + ``flip``),
``persist`` for ``save`` / ``load_predictor`` (no pickle), ``evaluation`` for prospective metrics.
"""

from trace_core.predictor import hashed as _hashed  # noqa: F401  (registers hashed_mlp / hashed_logistic)
from trace_core.predictor.base import (
    FitReport,
    Predictor,
    is_root,
    known_predictors,
    labelled,
    make_predictor,
    node_labels,
    register_predictor,
)
from trace_core.predictor.config import (
    CalibrationConfig,
    FeatureConfig,
    FlipConfig,
    ModelConfig,
    PredictorConfig,
    PriorConfig,
)
from trace_core.predictor.evaluation import evaluate_prospective, metrics_frame
from trace_core.predictor.hashed import HashedPredictor
from trace_core.predictor.persist import load_predictor

__all__ = [
    "CalibrationConfig",
    "FeatureConfig",
    "FitReport",
    "FlipConfig",
    "HashedPredictor",
    "ModelConfig",
    "Predictor",
    "PredictorConfig",
    "PriorConfig",
    "evaluate_prospective",
    "is_root",
    "known_predictors",
    "labelled",
    "load_predictor",
    "make_predictor",
    "metrics_frame",
    "node_labels",
    "register_predictor",
]
