"""A node store on object storage: a home given as ``s3://bucket/prefix`` instead of a path.

Shards go through pyarrow's S3 filesystem (``pyarrow.fs.S3FileSystem``): one PUT per shard, which
S3 makes visible whole or not at all (the atomicity a local write gets from temp file + rename; an
acknowledged PUT is durable, so there is nothing to fsync). DuckDB reads the same shards through
that filesystem wrapped for fsspec (``DuckDBPyConnection.register_filesystem``): DuckDB's own
``httpfs`` extension is downloaded on first use, which a machine without internet cannot do.

Endpoint and credentials come from the standard variables: ``AWS_ENDPOINT_URL`` (an
S3-compatible server such as MinIO; unset = AWS), ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``.
"""

from __future__ import annotations

import io
import os
from functools import lru_cache
from pathlib import Path

import polars as pl
import pyarrow.fs as pafs
from fsspec.implementations.arrow import ArrowFSWrapper

SCHEMES = ("s3://",)


def is_remote(home: str | Path) -> bool:
    """True for an object-storage home (``s3://...``); other ``scheme://`` homes are refused."""
    text = str(home)
    if text.startswith(SCHEMES):
        return True
    if "://" in text:
        raise ValueError(f"home {text!r}: object storage homes must start with one of {SCHEMES}")
    return False


def normalize(home: str | Path) -> str | Path:
    """``home`` with an object-storage URL restored if a ``Path`` folded its ``//``
    (``Path('s3://b/p')`` prints as ``s3:/b/p``: what a CLI option typed as a path hands over)."""
    text = str(home)
    for scheme in SCHEMES:
        folded = scheme[:-1]
        if isinstance(home, Path) and text.startswith(folded) and not text.startswith(scheme):
            return scheme + text[len(folded):]
    return home


def _key(url: str) -> str:
    return url.split("://", 1)[1]


@lru_cache(maxsize=8)
def _s3(endpoint: str | None, region: str | None) -> pafs.S3FileSystem:
    kw: dict = {"region": region} if region else {}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kw |= {"endpoint_override": host or scheme, "scheme": scheme if host else "https"}
    return pafs.S3FileSystem(**kw)


def filesystem() -> pafs.S3FileSystem:
    """The S3 filesystem the environment describes."""
    return _s3(os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))


class S3Fsspec(ArrowFSWrapper):
    """``filesystem()`` as an fsspec filesystem answering ``s3://`` URLs (what DuckDB registers)."""

    protocol = ("s3", "s3a")


def fsspec_filesystem() -> S3Fsspec:
    return S3Fsspec(filesystem())


def put_parquet(frame: pl.DataFrame, url: str, **write_options) -> str:
    """Write ``frame`` as one Parquet object at ``url`` (a single PUT: whole or absent)."""
    buf = io.BytesIO()
    frame.write_parquet(buf, **write_options)
    with filesystem().open_output_stream(_key(url)) as out:
        out.write(buf.getvalue())
    return url


def exists(url: str) -> bool:
    return filesystem().get_file_info(_key(url)).type != pafs.FileType.NotFound


def has_objects(url: str) -> bool:
    """True when some object lies under the prefix ``url``."""
    sel = pafs.FileSelector(_key(url).rstrip("/"), allow_not_found=True, recursive=False)
    return bool(filesystem().get_file_info(sel))


def read_parquet(url: str) -> pl.DataFrame:
    with filesystem().open_input_file(_key(url)) as fh:
        return pl.read_parquet(fh.read())


def list_parquet(url: str) -> list[str]:
    """The ``*.parquet`` objects directly under the prefix ``url``, as ``s3://`` URLs, sorted."""
    sel = pafs.FileSelector(_key(url).rstrip("/"), allow_not_found=True, recursive=False)
    scheme = url.split("://", 1)[0]
    return sorted(f"{scheme}://{info.path}" for info in filesystem().get_file_info(sel)
                  if info.path.endswith(".parquet") and info.type == pafs.FileType.File)
