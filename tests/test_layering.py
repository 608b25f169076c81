"""The library stays a library: no Prefect or MLflow in trace_core, DuckDB only in the store package."""

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


REPO = ROOT.parent
PACKAGES = ("trace_core", "tasks", "flows", "tracking")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(path: Path, known: set[str], *, where: str = "all") -> set[str]:
    """Project modules ``path`` imports. ``where``: "all" (module level, under ``TYPE_CHECKING`` and
    inside functions alike: a lazy import that breaks a cycle is still a cycle), "local" (only inside
    a function or class body) or "top" (only statements of the module body itself)."""
    import ast

    tree = ast.parse(path.read_text())
    body = {id(n) for n in tree.body}
    module_level = body | {id(m) for n in tree.body if isinstance(n, ast.If) for m in n.body}
    out: set[str] = set()
    for node in ast.walk(tree):
        if (where == "local" and id(node) in module_level) or (where == "top" and id(node) not in body):
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        out |= {n for n in names if n in known}
    return out


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """Project modules imported by the module body's own statements (what a config home may depend on)."""
    return _imports_of(path, known, where="top")


#: the command line's entry points (the commands and the checks they run first) import what each
#: command needs when it runs: `main()` installs its signal handlers before the stack is imported,
#: so a SIGTERM in the first second still ends the command with one line
LAZY_IMPORTS_ALLOWED = {"flows.cli", "flows.cli_checks"}


def _project_files() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def test_project_imports_are_module_level():
    """No function-local import of a project module outside the CLI's entry points: a module's
    dependencies are the imports at its top."""
    files = _project_files()
    local = {m: sorted(deps) for m, p in files.items()
             if m not in LAZY_IMPORTS_ALLOWED and (deps := _imports_of(p, set(files), where="local"))}
    assert not local, f"function-local project imports: {local}"


def test_no_import_cycle():
    files = _project_files()
    assert {m.split(".")[0] for m in files} == set(PACKAGES)  # the whole project is in the graph
    graph = {m: _imports_of(p, set(files)) - {m} for m, p in files.items()}
    # a package's __init__ importing its own submodules is how it exports them, not a cycle
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


#: registry modules a config may check names against at import time (they hold no implementation)
LIGHT_REGISTRIES = {"trace_core.envs.families"}


def test_config_modules_import_no_implementation():
    """A config home (``config.py``, ``*_config.py``) imports pydantic and other config homes only;
    names it checks against an implementation's registry are imported inside the validator."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    homes = {m for m in files
             if m.rsplit(".", 1)[-1] == "config" or m.endswith("_config") or m.startswith("trace_core.config.")}
    bad = {m: deps for m in sorted(homes)
           if (deps := _top_level_imports(files[m], set(files)) - homes - LIGHT_REGISTRIES)}
    assert not bad, f"config modules importing implementation modules: {bad}"


def test_modules_stay_readable():
    """One concept a module: nothing in the library grows past ~400 lines."""
    long = {str(p.relative_to(REPO)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 420}
    assert not long, long
