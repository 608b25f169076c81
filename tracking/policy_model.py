"""The logged policy as an MLflow pyfunc model, defined from code (``mlflow.models.set_model``):
MLflow copies this file into the model instead of pickling an object.

``predict`` takes questions (strings, or chat message lists) and returns the policy's first
action for each, decoded greedily with the run's chat format (``max_new_tokens`` param, default 64).
"""

from __future__ import annotations

import warnings
from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel

from trace_core.engines.base import GenRequest
from trace_core.engines.config import SamplingConfig
from trace_core.engines.hf import HFEngine
from trace_core.policy.chat import ChatFormat
from trace_core.policy.model import load_policy

# MLflow warns, wherever this file runs (log_model, load_model), that predict has no type hints: on
# purpose, the signature is logged explicitly. Its own "once" filter overrides an "ignore" one, so the
# warnings are recorded here and all others passed on.
with warnings.catch_warnings(record=True) as _caught:

    class TracePolicy(PythonModel):
        def load_context(self, context: Any) -> None:
            import yaml

            with open(context.artifacts["config"], encoding="utf-8") as f:
                model_cfg = (yaml.safe_load(f) or {}).get("model", {})
            self.model, self.tokenizer = load_policy(context.artifacts["checkpoint"])
            self.chat = ChatFormat(self.tokenizer, template=model_cfg.get("chat_template", "builtin"),
                                   enable_thinking=model_cfg.get("enable_thinking"))

        def predict(self, context, model_input, params=None):  # no type hints: MLflow would read them as a schema
            rows = model_input.iloc[:, 0].tolist() if hasattr(model_input, "iloc") else list(model_input)
            msgs = [r if isinstance(r, list) else [{"role": "user", "content": str(r)}] for r in rows]
            sampling = SamplingConfig(temperature=0.0, max_new_tokens=int((params or {}).get("max_new_tokens", 64)))
            out = HFEngine(self.model, self.chat).generate(
                [GenRequest(prompt_ids=tuple(self.chat.prompt_ids(m))) for m in msgs], sampling)
            return [res[0].text for res in out]


    mlflow.models.set_model(TracePolicy())
for _w in _caught:
    if "Add type hints to the `predict` method" not in str(_w.message):
        warnings.warn_explicit(_w.message, _w.category, _w.filename, _w.lineno)
