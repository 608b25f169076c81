"""One writer per run: an advisory lock file in the run directory.

``home/runs/<id>/writer.lock`` is locked with ``flock(LOCK_EX | LOCK_NB)`` by the process that
trains the run, and holds that process's pid, host and start time (JSON) for the refusal
message. The kernel drops the lock when the holder exits, however it exits (kill -9 included),
so a stale lock from a dead process is taken over without any pid check; a second writer while
the holder lives is refused at once with ``RunLocked`` naming the holder. The file itself stays
(emptied on release): deleting it could let two processes lock two different inodes.

Advisory: it binds processes that use it (``train``, ``compare``), not ``rm`` or an editor. On
a filesystem without ``flock`` (ENOLCK) it warns and proceeds unlocked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "writer.lock"


class RunLocked(RuntimeError):
    """Another live process holds the run's writer lock."""


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']} since {info['started']}"
    except (ValueError, KeyError, TypeError, OSError):
        return "another process"


def acquire_run_lock(run_dir: str | Path) -> int | None:
    """Lock ``run_dir``'s writer lock; returns its file descriptor (``None`` if unsupported)."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            who = _holder(fd)
            os.close(fd)
            raise RunLocked(f"run {path.parent.name} is being written by {who} (lock {path}); "
                            "wait for it to finish or stop it, or use another --run-id") from None
        os.close(fd)
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            warnings.warn(f"{path}: file locks unsupported here; the run is not protected against a second "
                          "writer", RuntimeWarning, stacklevel=2)
            return None
        raise
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    return fd


def release_run_lock(fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold_run_lock(run_dir: str | Path) -> Iterator[None]:
    """``with hold_run_lock(ref.run_dir):`` the body is the run's only writer."""
    fd = acquire_run_lock(run_dir)
    try:
        yield
    finally:
        release_run_lock(fd)
