"""The library stays a library: no Prefect or MLflow in trace_core, DuckDB only in store.py."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "trace_core"
IMPORT = re.compile(r"^\s*(?:import|from)\s+([a-zA-Z_][\w]*)", re.M)


def _imports(path: Path) -> set[str]:
    return set(IMPORT.findall(path.read_text()))


def test_trace_core_imports_no_prefect_or_mlflow():
    banned = {"prefect", "mlflow", "tasks", "flows", "tracking"}
    bad = {str(p.relative_to(ROOT)): _imports(p) & banned for p in ROOT.rglob("*.py") if _imports(p) & banned}
    assert not bad, f"trace_core must not import the orchestration/tracking layers: {bad}"


def test_duckdb_only_in_store():
    users = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if "duckdb" in _imports(p)]
    assert users == ["store.py"], users
