"""The pipelined training loop (``run.max_staleness`` = S > 0): the rollout side of the next
iterations runs while this iteration's update trains.

    rollout side (a thread)                          update side (the flow's thread)
    for i:  wait for weights version max(0, i - S)   for i:  wait for iteration i's verified trees
            (1) predictor .. (6) verified   ──trees──►       (7) update: version i -> i + 1
                                            ◄──weights──     evaluate, record, track

The rollout side samples iteration i with version ``max(0, i - S)`` (``stages.versions``): a
function of i alone, so a resumed run regenerates the same trees whatever the timing was, and
Prefect's cache replays both sides' finished stages. Both sides call the same cached stage tasks
as the synchronous loop; their task runs overlap in the Prefect UI. MLflow gets, per iteration,
the staleness the update saw and the seconds each side waited for the other (``pipeline/*``).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flows.ending import IterationEnd
from tasks.artifacts import iteration_tag
from tasks.stages import StageRunner, StageTasks
from trace_core import cancel
from trace_core.config import TrainConfig
from trace_core.runtime import Runtime
from trace_core.stages.results import (
    Extensions,
    Generation,
    IterationResults,
    PredictorFit,
    PrefixAllocation,
    RootAllocation,
    Verified,
)
from trace_core.stages.run import RunRef
from trace_core.stages.versions import rollout_version

JOIN_S = 10.0  # seconds a stopped pipeline waits for its rollout side (it stops at its next turn)


class Stopped(Exception):
    """The pipeline was stopped (the update side ended, by an error or a signal)."""


@dataclass(frozen=True)
class RolloutSide:
    """Stages (1)-(6) of one iteration, and the seconds they waited for the weights."""

    predictor: PredictorFit
    roots: RootAllocation
    raw: Generation
    prefixes: PrefixAllocation
    extensions: Extensions
    verified: Verified
    waited_s: float


class Handoff:
    """What the two sides hand each other: weights by policy version, verified trees by
    iteration; an error on either side stops both."""

    def __init__(self, first_checkpoint: str) -> None:
        self._cond = threading.Condition()
        self._weights: dict[int, str] = {0: first_checkpoint}
        self._sides: dict[int, RolloutSide] = {}
        self._error: BaseException | None = None
        self._stopped = False

    def _wait(self, ready: Callable[[], Any]) -> tuple[Any, float]:
        t0 = time.perf_counter()
        with self._cond:
            while (got := ready()) is None:
                if self._error is not None:
                    raise self._error
                if self._stopped:
                    raise Stopped("the pipeline was stopped")
                self._cond.wait(0.5)
        return got, time.perf_counter() - t0

    def weights(self, version: int) -> tuple[str, float]:
        """The checkpoint of ``version`` once the update wrote it, and the seconds waited."""
        return self._wait(lambda: self._weights.get(version))

    def side(self, iteration: int) -> tuple[RolloutSide, float]:
        """Iteration ``iteration``'s rollout side once verified, and the seconds waited."""
        return self._wait(lambda: self._sides.get(iteration))

    def put_weights(self, version: int, checkpoint: str) -> None:
        with self._cond:
            self._weights[version] = checkpoint
            self._cond.notify_all()

    def put_side(self, iteration: int, side: RolloutSide) -> None:
        with self._cond:
            self._sides[iteration] = side
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped


def rollout_stages(t: StageTasks, ref: RunRef, cfg: TrainConfig, i: int, before: Any, checkpoint: str, rt: Runtime,
                   run: StageRunner) -> tuple[PredictorFit, RootAllocation, Generation, PrefixAllocation, Extensions,
                                              Verified]:
    """Stages (1)-(6) of iteration ``i`` on the weights at ``checkpoint``: the synchronous loop's
    and the pipeline's rollout side's."""
    predictor = run(t.refresh_predictor, ref, cfg, i, before)                              # (1)
    roots = run(t.allocate_roots, ref, cfg, i, predictor, checkpoint, rt)                  # (2)
    raw = run(t.generate_raw_rollouts, ref, cfg, i, checkpoint, roots, rt)                 # (3)
    prefixes = run(t.score_prefixes, ref, cfg, i, predictor, roots, raw, checkpoint, rt)   # (4)
    extensions = run(t.extend_and_refill, ref, cfg, i, checkpoint, raw, prefixes, rt)      # (5)
    verified = run(t.verify_rewards, ref, cfg, i, predictor, roots, raw, prefixes, extensions, rt)  # (6)
    return predictor, roots, raw, prefixes, extensions, verified


def rollout_side(h: Handoff, t: StageTasks, ref: RunRef, cfg: TrainConfig, rt: Runtime, run: StageRunner,
                 before: Any, tags: list[str]) -> None:
    """Stages (1)-(6) of every iteration in order, each on the weights of its version."""
    try:
        for i in range(cfg.run.iterations):
            checkpoint, waited = h.weights(rollout_version(i, cfg.run.max_staleness))
            run.next_iteration(tags=[*tags, iteration_tag(i)])
            h.put_side(i, RolloutSide(*rollout_stages(t, ref, cfg, i, before, checkpoint, rt, run), waited))
            if h.stopped:
                return
    except Stopped:
        pass
    except BaseException as err:  # noqa: BLE001 - handed to the update side, which raises it
        h.fail(err)
    finally:
        cancel.done()


def pipelined_iterations(t: StageTasks, ref: RunRef, cfg: TrainConfig, rt: Runtime, run: StageRunner,
                         end: IterationEnd, tags: list[str], checkpoint: str) -> str:
    """Every iteration with the rollout side running ahead by up to ``run.max_staleness``
    versions; returns the last checkpoint. The update side is this thread (signals reach it)."""
    h = Handoff(checkpoint)
    rollouts = StageRunner(run.log, run.home)  # its own replay state; the lost outputs it recomputes are reported
    rollouts.recomputed = run.recomputed
    lane = threading.Thread(target=contextvars.copy_context().run, name="rollout-side", daemon=True,
                            args=(rollout_side, h, t, ref, cfg, rt, rollouts, end.before, tags))
    lane.start()
    t_iter = time.perf_counter()  # an iteration's wall time: from the previous one's end (the pipeline's period)
    try:
        for i in range(cfg.run.iterations):
            side, waited = h.side(i)
            run.next_iteration(tags=[*tags, iteration_tag(i)])
            update = run(t.update_policy, ref, cfg, i, checkpoint, side.verified, rt)  # (7)
            checkpoint = update.checkpoint
            h.put_weights(i + 1, checkpoint)
            results = IterationResults(predictor=side.predictor, roots=side.roots, raw=side.raw,
                                       prefixes=side.prefixes, extensions=side.extensions, verified=side.verified,
                                       update=update)
            end(run, i, results, t_iter, keep_extra=cfg.run.max_staleness)
            end.tracker.log({"pipeline/staleness_mean": update.staleness_mean,
                             "pipeline/staleness_max": update.staleness_max, "pipeline/refused": update.refused,
                             "pipeline/update_waited_s": waited, "pipeline/rollouts_waited_s": side.waited_s},
                            step=i, group="pipeline")
            t_iter = time.perf_counter()
    finally:
        h.stop()
        if lane.is_alive():
            cancel.request(lane)  # its in-process generation ends at its next turn (a worker's with the runtime)
            lane.join(JOIN_S)
            if lane.is_alive():
                run.log.warning("the rollout side's stage in flight did not stop within %.0f s", JOIN_S)
    return checkpoint
