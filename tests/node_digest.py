"""A per-column digest of a node table: what the pinned-output test compares (timing columns
left out; rows in node-id order; floats rounded to 3 decimals, since log-probs and predictor
outputs differ in their last bits between CPUs with different SIMD kernels)."""

from __future__ import annotations

import hashlib

import polars as pl

VOLATILE = ("gen_seconds", "created_at")
DECIMALS = 3


def node_digest(nodes: pl.DataFrame) -> dict[str, str]:
    frame = nodes.drop([c for c in VOLATILE if c in nodes.columns]).sort("node_id")
    out = {"rows": str(frame.height)}
    for col in frame.columns:
        series = frame[col]
        if series.dtype.is_float():
            series = series.round(DECIMALS)
        elif isinstance(series.dtype, pl.List) and series.dtype.inner.is_float():
            series = series.list.eval(pl.element().round(DECIMALS))
        if isinstance(series.dtype, pl.List):
            series = series.list.eval(pl.element().cast(pl.Utf8)).list.join(",")
        text = "\n".join("" if v is None else repr(v) for v in series.to_list())
        out[col] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out


if __name__ == "__main__":  # python tests/node_digest.py HOME RUN_ID  -> the digest as JSON
    import json
    import sys
    from pathlib import Path

    home, run = Path(sys.argv[1]), sys.argv[2]
    frame = pl.read_parquet(home / "shards" / "nodes" / f"run_id={run}" / "**" / "final.parquet")
    print(json.dumps(node_digest(frame), indent=1))
