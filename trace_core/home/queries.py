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
from trace_core.analysis.outfile import check_out_path, write_output
from trace_core.home import objstore
from trace_core.home.layout import check_home_path

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
                    skip_bad: bool = False, from_nodes: bool = False) -> pl.DataFrame:
    """Run ``sql/NAME.sql`` over the shards under ``home_dir``; ``run_id=None`` = all runs;
    ``skip_bad``: leave out shards that do not open (``CorruptShard`` names the first otherwise);
    ``from_nodes``: groups recomputed from the node shards, not read from their stored summaries.
    ``home_dir`` may be an object-storage home (``s3://bucket/prefix``, see ``trace_core.home.objstore``)."""
    return catalogue.query(home_dir, load_query(name), {"run_id": run_id}, skip_bad=skip_bad, from_nodes=from_nodes)


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


class UnknownRunId(LookupError):
    """A ``--run-id`` the home holds no rows for (one line naming the ones it holds)."""


def known_runs(home_dir: str | Path) -> list[str]:
    """Run ids with rows in the home, and the comparison ids their runs belong to."""
    text = (catalogue.sql_dir() / "catalog" / "known_runs.sql").read_text()
    return catalogue.query(home_dir, text)["run_id"].to_list()


def check_run_known(home_dir: str | Path, run_id: str) -> None:
    """``UnknownRunId`` unless the home holds rows of ``run_id`` (a run or a comparison)."""
    known = known_runs(home_dir)
    if run_id in known:
        return
    shown = ", ".join(known[:20]) + (f" (+{len(known) - 20} more)" if len(known) > 20 else "")
    raise UnknownRunId(f"unknown run id {run_id!r} in {home_dir}: " + (f"known runs: {shown}" if known
                                                                        else "the home holds no runs yet"))


def output_format(fmt: str | None, output: str | Path | None) -> OutputFormat:
    """The format asked for, or the one ``output``'s extension names (``.parquet``, ``.csv``;
    otherwise a table). A format that contradicts the extension is an error, and so is parquet
    without a file to write."""
    suffix = Path(output).suffix.lower() if output is not None else ""
    implied = {".parquet": "parquet", ".csv": "csv"}.get(suffix)
    if fmt is None:
        return implied or "table"
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    if implied is not None and implied != fmt:
        raise ValueError(f"--out {output} ends in {suffix} but --format is {fmt}; drop --format or change the name")
    if fmt == "parquet" and output is None:
        raise ValueError("--format parquet writes a file: give --out FILE.parquet")
    return fmt  # type: ignore[return-value]


def sql_command(
    name: str,
    *,
    run_id: str | None = None,
    fmt: OutputFormat | None = None,
    home_dir: str | Path = ".",
    output: str | Path | None = None,
    skip_bad: bool = False,
) -> str:
    """Run a named query and render it; what the CLI prints.

    The format is ``fmt``, else the one ``output``'s extension names, else a table (``output_format``).
    ``parquet`` writes ``output`` (required) and returns a one-line note; ``table``/``csv`` return
    the text, also written to ``output`` if given. An unknown ``run_id`` raises ``UnknownRunId``
    (one line naming the runs the home holds) instead of answering with an empty table; a
    comparison id selects its children. ``skip_bad``: query around unreadable shards (each named
    in a warning).
    """
    fmt = output_format(fmt, output)
    load_query(name)  # an unknown name fails before the home is looked at
    home_dir = objstore.normalize(home_dir)
    if objstore.is_remote(home_dir):
        home = str(home_dir)
        if not catalogue.has_store(home):
            raise FileNotFoundError(f"no node store under {home} (no shards/); check --home")
    else:
        home = _local_home(home_dir)
    path = Path(output) if output is not None else None
    if path is not None and path.is_dir():
        raise IsADirectoryError(f"--out {path} is a directory; give a file path")
    if path is not None:  # a regular file or nothing: never a link's target, a device or a FIFO
        check_out_path(path)
    frame = run_named_query(home, name, run_id=run_id, skip_bad=skip_bad)
    if run_id is not None and frame.height == 0:
        check_run_known(home, run_id)
    if fmt == "parquet":
        buf = io.BytesIO()
        frame.write_parquet(buf)
        write_output(path, buf.getvalue())
        return f"wrote {frame.height} rows to {path}"
    text = render(frame, fmt)
    if path is not None:
        write_output(path, text)
        return f"wrote {frame.height} rows to {path} ({fmt})"
    return text


def _local_home(home_dir: str | Path) -> Path:
    home = check_home_path(home_dir)  # glob characters would read other homes' shards
    if home.exists() and not home.is_dir():
        raise NotADirectoryError(f"home {home} is a file, not a run home directory")
    if not catalogue.has_store(home):  # a mistyped --home: say so, create nothing
        raise FileNotFoundError(f"no node store under {home} (no shards/ or {catalogue.CATALOG_FILE}); check --home")
    return home
