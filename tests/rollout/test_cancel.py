"""A stopping pipelined run ends its in-process rollout side at the next turn (``trace_core.cancel``);
generation in any other thread goes on."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from trace_core import cancel
from trace_core.engines.config import SamplingConfig
from trace_core.rollout.agent_loop import LiveEpisode, RolloutConfig, run_episodes


class _NoCalls:
    """An engine that must not be asked for a turn."""

    def generate(self, requests, sampling):
        raise AssertionError("generated after the stop request")


def _live() -> LiveEpisode:
    return LiveEpisode(task=SimpleNamespace(prompt_id="q"), episode=None, context=[1, 2, 3], parent_id="p", trajectory_id="t", path="r0",
                       depth=0, origin="raw", base={})


def test_a_stop_request_ends_that_threads_batch_before_its_next_turn():
    go, out = threading.Event(), {}

    def lane():
        go.wait(5)
        try:
            run_episodes(_NoCalls(), None, [_live()], sampling=SamplingConfig(), cfg=RolloutConfig(progress=False))
        except cancel.Cancelled as err:
            out["err"] = err
        finally:
            cancel.done()

    t = threading.Thread(target=lane)
    t.start()
    cancel.request(t)
    go.set()
    t.join(5)
    assert "the run is stopping" in str(out["err"])
    cancel.check()  # this thread was not asked: nothing raised
    assert not cancel._REQUESTED  # the lane forgot its request when it ended


def test_an_unasked_thread_is_not_stopped():
    with pytest.raises(AssertionError, match="generated"):  # it reaches the engine
        run_episodes(_NoCalls(), None, [_live()], sampling=SamplingConfig(), cfg=RolloutConfig(progress=False))
