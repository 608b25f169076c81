"""Stages 1-6 of one iteration, called directly in flow order (no Prefect): the shared set-up of
the tests that exercise a stage on real rollouts of the shipped tiny policy."""

from __future__ import annotations

from trace_core.stages import iteration as it


def run_until_verified(ref, cfg, checkpoint: str, before, runtime) -> dict:
    """The records of stages 1-6 at iteration 0, keyed like ``IterationResults``' fields, on the
    run's ``runtime`` (``trace_core.runtime.Runtime``)."""
    pred = it.refresh_predictor(ref, cfg, 0, before)
    roots = it.allocate_roots(ref, cfg, 0, pred)
    raw = it.generate_raw_rollouts(ref, cfg, 0, checkpoint, roots, runtime)
    prefixes = it.score_prefixes(ref, cfg, 0, pred, roots, raw)
    extensions = it.extend_and_refill(ref, cfg, 0, checkpoint, raw, prefixes, runtime)
    verified = it.verify_rewards(ref, cfg, 0, pred, roots, raw, prefixes, extensions, runtime)
    return {"predictor": pred, "roots": roots, "raw": raw, "prefixes": prefixes, "extensions": extensions,
            "verified": verified}
