"""A request that one thread stop generating: the pipelined flow's rollout side runs in a thread
that a signal cannot reach, so when the update side stops it asks here, and the agent loop of that
thread ends its batch at the next turn (``check`` raises ``Cancelled``) instead of running on into
the interpreter's exit (a thread still inside torch there ends the process with SIGABRT). Other
threads — a later run's generation in the same process — are not touched."""

from __future__ import annotations

import threading

_LOCK = threading.Lock()
_REQUESTED: set[int] = set()  # idents of the threads asked to stop


class Cancelled(Exception):
    """Generation stopped at a turn boundary because the run is stopping."""


def request(thread: threading.Thread) -> None:
    """Ask ``thread`` to stop generating at its next turn."""
    with _LOCK:
        if thread.ident is not None:
            _REQUESTED.add(thread.ident)


def done() -> None:
    """The calling thread is ending: forget any request made to it (its ident may be reused)."""
    with _LOCK:
        _REQUESTED.discard(threading.get_ident())


def check() -> None:
    """Raise ``Cancelled`` in a thread that was asked to stop."""
    if _REQUESTED and threading.get_ident() in _REQUESTED:
        raise Cancelled("generation stopped: the run is stopping")
