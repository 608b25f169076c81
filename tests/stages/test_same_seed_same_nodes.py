"""Same config and seed, same node table: stages 1-6 of iteration 0 run in two
separate processes with different hash seeds give identical node tables, column by column
(``node_digest``: floats to 3 decimals), hence the same effective ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trace_core.policy.model import TINY_WARM_DIR

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                                   reason="shipped tiny checkpoint missing")]

RUN = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import polars as pl
    from tests.iteration_stages import run_until_verified
    from tests.node_digest import node_digest
    from trace_core.stages import iteration as it
    from trace_core.config import load_train_config
    from trace_core.runtime import Runtime
    from trace_core.stages.run import RunRef, initial_checkpoint
    out = Path(sys.argv[1])
    cfg = load_train_config(sys.argv[2], ["run.threads=1"])
    ref = RunRef(str(out), "d")
    ck = initial_checkpoint(cfg)
    rt = Runtime(cfg)
    st = run_until_verified(ref, cfg, ck, it.evaluate(cfg, ck, rt), rt)
    nodes = pl.read_parquet(st["verified"].nodes, hive_partitioning=False)
    print(json.dumps({"eff": st["verified"].effective_ratio, "digest": node_digest(nodes)}))
""")


def _run(home: Path, hashseed: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hashseed}
    res = subprocess.run([sys.executable, "-c", RUN, str(home), str(ROOT / "configs" / "small-ci.yaml")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_same_seed_same_node_table_across_processes(tmp_path):
    a, b = _run(tmp_path / "a", "1"), _run(tmp_path / "b", "2")
    assert a["eff"] == b["eff"]
    assert {k for k in a["digest"] if a["digest"][k] != b["digest"][k]} == set()
