"""The local MLflow SQLite store, made whole or not at all.

MLflow creates ``mlflow.db`` in place, in ~30 schema migrations: a kill or a full disk in the
middle leaves a half-migrated database that every later session fails on ("duplicate column",
"table _alembic_tmp_... already exists"). Here the database is migrated under a temporary name
in the same directory and linked into place only when complete (``os.link`` never replaces a
database another process made meanwhile). A half-made database left by an older version (or a
file that is not SQLite) holding no runs is moved aside and rebuilt; one holding runs is left
for MLflow to report.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other backend or in-memory)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    if not path or path == ":memory:" or path.endswith("/:memory:"):
        return None
    return Path(path)


def half_made(db: Path) -> bool:
    """True for a database MLflow's migrations did not finish (or a file that is not SQLite).

    Opened read-write: a writer killed mid-transaction leaves a hot journal that only a writing
    connection rolls back (a read-only one fails with SQLITE_READONLY_ROLLBACK on a whole store).
    Any error but "not a database" or "malformed" (a lock, a full disk) is raised, never taken
    for a half-made store."""
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if any(t.startswith("_alembic_tmp_") for t in tables) or "alembic_version" not in tables:
                return True
            version = con.execute("SELECT version_num FROM alembic_version").fetchall()
            return len(version) != 1 or version[0][0] != _head_revision()
    except sqlite3.DatabaseError as err:
        if _unreadable(err):  # "file is not a database", a torn header
            return True
        raise


def _unreadable(err: sqlite3.DatabaseError) -> bool:
    name = getattr(err, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")) or (
        not name and not isinstance(err, sqlite3.OperationalError))


def _holds_runs(db: Path) -> bool:
    """Whether ``db`` holds MLflow runs; True when that cannot be read (never set a store aside
    that might hold runs), False only for no ``runs`` table, no rows or a file that is not SQLite."""
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as con:
            if not con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone():
                return False
            return con.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.DatabaseError as err:
        return not _unreadable(err)


def _head_revision() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


_LOCK = threading.Lock()  # alembic's migrations are not thread-safe (a comparison's trackers share a process)


def prepare_sqlite_store(db: Path) -> None:
    """Make sure ``db`` is a complete MLflow store (a no-op when it is one); one thread of one
    process at a time per database (a lock file beside it)."""
    with _LOCK:
        db.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock = open(db.with_name(f".{db.name}.lock"), "a")  # noqa: SIM115 - held for the block below
        except OSError:
            lock = None  # a full disk: the creation below fails and is retried anyway
        try:
            if lock is not None:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            _prepare(db)
        finally:
            if lock is not None:
                lock.close()


def _prepare(db: Path) -> None:
    if db.is_file() and db.stat().st_size > 0:
        if not half_made(db) or _holds_runs(db):
            return  # complete, or an older schema holding runs: MLflow upgrades it or says why
        aside = db.with_name(f"{db.name}.half-made-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(db, aside)
        log.warning("%s was half-created (a crash or a full disk during its creation): moved to %s and "
                    "rebuilt; pending records are replayed into the new store", db, aside.name)
    elif db.is_file():  # empty: created by sqlite and never migrated
        db.unlink()
    db.parent.mkdir(parents=True, exist_ok=True)
    for stale in db.parent.glob(f".{db.name}.*.tmp*"):  # left by a killed creator
        pid = stale.name.removeprefix(f".{db.name}.").split(".", 1)[0].split("-", 1)[0]
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                stale.unlink()
    # unique per attempt; a killed creator's is removed above
    tmp = db.with_name(f".{db.name}.{os.getpid()}-{time.monotonic_ns()}.tmp")
    try:
        _create(tmp)
        fd = os.open(tmp, os.O_RDONLY)  # on disk before it becomes the store
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process made it first: keep theirs
            os.link(tmp, db)
    finally:
        for p in (tmp, tmp.with_name(tmp.name + "-journal")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def _create(path: Path) -> None:
    """MLflow's schema, every migration applied, in a new database at ``path``."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    engine = sqlalchemy.create_engine(f"sqlite:///{path}", poolclass=sqlalchemy.pool.NullPool)
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()


def rehome_local_store(home_dir: str | Path) -> int:
    """Re-root the artifact locations of ``DIR/mlflow.db`` at ``DIR/mlartifacts`` when the home
    was moved (MLflow stores them as absolute URIs): a resumed run then logs its artifacts in the
    home it runs in, never at the old location. Returns the number of rows changed."""
    home = Path(home_dir).resolve()
    db, here = home / "mlflow.db", (home / "mlartifacts").as_uri()
    if not db.is_file():
        return 0
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as con, con:
        rows = con.execute("SELECT artifact_location FROM experiments WHERE artifact_location LIKE 'file://%/mlartifacts'"
                           ).fetchall()
        changed = 0
        for (old,) in rows:
            if old == here:
                continue
            changed += con.execute("UPDATE experiments SET artifact_location = ? WHERE artifact_location = ?",
                                   (here, old)).rowcount
            changed += con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                                   "WHERE substr(artifact_uri, 1, ?) = ?", (here, len(old) + 1, len(old), old)).rowcount
    if changed:  # this process may hold artifact stores of the old location, by run id
        from mlflow.tracking._tracking_service import utils as tracking_utils

        getattr(tracking_utils, "_artifact_repos_cache", {}).clear()
        log.info("home moved: MLflow artifact locations re-rooted at %s (%d rows)", here, changed)
    return changed
