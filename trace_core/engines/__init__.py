"""Rollout engines behind one protocol; ``make_engine(name, **kwargs)`` imports the chosen one lazily."""

from trace_core.engines.base import (
    Engine,
    GenRequest,
    GenResult,
    SamplingConfig,
    engine_class,
    engine_names,
    make_engine,
    register_engine,
)

__all__ = ["Engine", "GenRequest", "GenResult", "SamplingConfig", "engine_class", "engine_names", "make_engine",
           "register_engine"]
