"""A stopping pipelined run ends its in-process rollout side at the next turn (``trace_core.cancel``)."""

from __future__ import annotations

import pytest

from trace_core import cancel
from trace_core.engines.config import SamplingConfig
from trace_core.rollout.agent_loop import LiveEpisode, RolloutConfig, run_episodes


class _NoCalls:
    """An engine that must not be asked for a turn."""

    def generate(self, requests, sampling):
        raise AssertionError("generated after the stop request")


def _live() -> LiveEpisode:
    return LiveEpisode(task=None, episode=None, context=[1, 2, 3], parent_id="p", trajectory_id="t", path="r0",
                       depth=0, origin="raw", base={})


def test_a_stop_request_ends_the_batch_before_its_next_turn():
    cancel.request()
    try:
        with pytest.raises(cancel.Cancelled, match="the run is stopping"):
            run_episodes(_NoCalls(), None, [_live()], sampling=SamplingConfig(), cfg=RolloutConfig(progress=False))
    finally:
        cancel.clear()
    assert run_episodes(_NoCalls(), None, [], sampling=SamplingConfig(), cfg=RolloutConfig(progress=False)) == []
    cancel.check()  # cleared: nothing raised
