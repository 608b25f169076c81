"""Named analysis queries: one ``sql/NAME.sql`` file per question, run against the node store.

No SQL is built in Python: a query is read from its file and its ``$run_id`` parameter is bound
by DuckDB. ``sql_command`` is what ``trace-rl sql NAME [--run-id ID] [--format F] [--home DIR]``
calls.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Literal

import polars as pl

from trace_core import store as catalogue
from trace_core.nodestore import objstore
from trace_core.nodestore.layout import check_home_path
from trace_core.outfile import check_out_path, write_output

OutputFormat = Literal["table", "csv", "parquet"]
FORMATS: tuple[str, ...] = ("table", "csv", "parquet")
_NOT_QUERIES = {"schema"}  # sql/schema.sql is the catalogue DDL, not a question


def list_queries() -> list[str]:
    """Names of the named queries (``sql/*.sql`` except the schema), sorted."""
    return sorted(p.stem for p in catalogue.sql_dir().glob("*.sql") if p.stem not in _NOT_QUERIES)


def load_query(name: str) -> str:
    known = list_queries()
    if name not in known:
        raise KeyError(f"unknown query {name!r}; known queries: {', '.join(known)}")
    return (catalogue.sql_dir() / f"{name}.sql").read_text()


def describe_query(name: str) -> str:
    """The question a query answers: its leading ``--`` comment lines."""
    lines = []
    for line in load_query(name).splitlines():
        if not line.startswith("--"):
            break
        lines.append(line.removeprefix("--").strip())
    return " ".join(lines)


def run_named_query(home_dir: str | Path, name: str, run_id: str | None = None, *,
                    skip_bad: bool = False) -> pl.DataFrame:
    """Run ``sql/NAME.sql`` over the shards under ``home_dir``; ``run_id=None`` = all runs;
    ``skip_bad``: leave out shards that do not open (``CorruptShard`` names the first otherwise).
    ``home_dir`` may be an object-storage home (``s3://bucket/prefix``, see ``trace_core.nodestore.objstore``)."""
    return catalogue.query(home_dir, load_query(name), {"run_id": run_id}, skip_bad=skip_bad)


def render(frame: pl.DataFrame, fmt: OutputFormat) -> str:
    """A result as text: an aligned table (every row and column) or CSV."""
    if fmt == "table":
        with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=200):
            return str(frame)
    if fmt == "csv":
        buf = io.StringIO()
        frame.write_csv(buf)
        return buf.getvalue()
    raise ValueError(f"format {fmt!r} has no text form; formats: {FORMATS}")


def sql_command(
    name: str,
    *,
    run_id: str | None = None,
    fmt: OutputFormat = "table",
    home_dir: str | Path = ".",
    output: str | Path | None = None,
    skip_bad: bool = False,
) -> str:
    """Run a named query and render it; what the CLI prints.

    ``fmt='parquet'`` writes ``output`` (default ``NAME.parquet`` in the working directory) and
    returns a one-line note; ``table``/``csv`` return the text, also written to ``output`` if
    given. ``skip_bad``: query around unreadable shards (each named in a warning).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    load_query(name)  # an unknown name fails before the home is looked at
    home_dir = objstore.normalize(home_dir)
    if objstore.is_remote(home_dir):
        home = str(home_dir)
        if not catalogue.has_store(home):
            raise FileNotFoundError(f"no node store under {home} (no shards/); check --home")
    else:
        home = _local_home(home_dir)
    path = Path(output) if output is not None else (Path(f"{name}.parquet") if fmt == "parquet" else None)
    if path is not None:  # a regular file or nothing: never a link's target, a device or a FIFO
        check_out_path(path)
    frame = run_named_query(home, name, run_id=run_id, skip_bad=skip_bad)
    if fmt == "parquet":
        buf = io.BytesIO()
        frame.write_parquet(buf)
        write_output(path, buf.getvalue())
        return f"wrote {frame.height} rows to {path}"
    text = render(frame, fmt)
    if path is not None:
        write_output(path, text)
    return text


def _local_home(home_dir: str | Path) -> Path:
    home = check_home_path(home_dir)  # glob characters would read other homes' shards
    if home.exists() and not home.is_dir():
        raise NotADirectoryError(f"home {home} is a file, not a run home directory")
    if not catalogue.has_store(home):  # a mistyped --home: say so, create nothing
        raise FileNotFoundError(f"no node store under {home} (no shards/ or {catalogue.CATALOG_FILE}); check --home")
    return home
