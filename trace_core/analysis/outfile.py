"""Output files the user names (``sql --out``, ``report --out``): a regular file, written whole.

The target is refused, before anything is computed, when it is a symbolic link (writing would land
wherever the link points), a device, a FIFO or a socket (renaming over one would replace the node,
writing into a FIFO blocks until someone reads), a directory, or sits in no directory. A regular
file is written under a temporary sibling name and renamed into place: readers see the old file or
the whole new one, and a full disk leaves the old one untouched.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def check_out_path(path: str | Path, flag: str = "--out") -> Path:
    """``path`` if it is absent or a regular file in an existing directory; ``ValueError`` /
    ``OSError`` naming it otherwise."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise ValueError(f"{flag} {path} is a symbolic link; name the file itself")
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"{flag} {path} is a directory; give a file path")
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{flag} {path} is not a regular file (a device, FIFO or socket); name a regular file")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{flag} {path}: directory {path.parent} does not exist")
    return path


def write_output(path: str | Path, data: bytes | str, flag: str = "--out") -> Path:
    """Write ``data`` to the regular file ``path`` (checked again here), atomically."""
    path = check_out_path(path, flag)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a name in the directory the user named, never a link's target
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path
