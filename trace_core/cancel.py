"""A process-wide request to stop generating: the pipelined flow's rollout side runs in a thread
that a signal cannot reach, so when the update side stops it asks here, and the agent loop ends its
batch at the next turn (``check`` raises ``Cancelled``) instead of running on into the
interpreter's exit (a thread still inside torch there ends the process with SIGABRT)."""

from __future__ import annotations

import threading

_REQUESTED = threading.Event()


class Cancelled(Exception):
    """Generation stopped at a turn boundary because the run is stopping."""


def request() -> None:
    _REQUESTED.set()


def clear() -> None:
    _REQUESTED.clear()


def check() -> None:
    if _REQUESTED.is_set():
        raise Cancelled("generation stopped: the run is stopping")
