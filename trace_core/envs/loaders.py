"""Loaders for local files of the public datasets, each record -> ``Task`` (registry ``LOADERS``).

Formats (``.jsonl``, ``.json`` array or JSON lines, ``.parquet`` — read with pyarrow):

* GSM8K    ``{question, answer: "... <<a*b=c>> ... #### N"}``; the ``<<...>>`` steps become the
  calculator demonstration. Difficulty from the step count.
* MATH     ``{problem, solution, level: "Level k", answer?}``; answer = ``answer`` or the last
  ``\\boxed{}`` of ``solution``. Difficulty from the level (1-2 -> 0, 3 -> 1, 4 -> 2, 5 -> 3).
* HotpotQA ``{_id, question, answer, context: [[title, [sentences]]], supporting_facts, level}``;
  the corpus is the record's paragraphs (titles shown); demo searches the supporting titles.
* MuSiQue  ``{id, question, answer, answer_aliases, paragraphs: [{title, paragraph_text}],
  question_decomposition: [{paragraph_support_idx}]}``; unanswerable records are skipped.
* BFCL     BFCL's data directory and a category: ``trace_core.envs.fc.bfcl`` (re-exported here).
* xLAM     ``{id, query, tools, answers}`` (``tools`` / ``answers`` lists or JSON strings).

GSM8K, MATH, HotpotQA, MuSiQue and xLAM convert one record at a time (``ROW_LOADERS``):
``load_rows`` reports a bad record (not JSON, a missing or mistyped field, an empty question or
answer) as ``file:line: bad <format> row: why`` and raises or skips it; training on whole files
(mixing, held-out split, corpus) is ``trace_core.envs.datasets``.

BFCL data offline (the ``bfcl-eval`` wheel unpacked, never installed): ``scripts/fetch-bfcl-eval.sh
DIR``, then ``load_bfcl("DIR/bfcl_eval/data", "simple_python")``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trace_core.envs.base import Task
from trace_core.envs.fc.ast_rule import as_possible_answer
from trace_core.envs.fc.bfcl import load_bfcl
from trace_core.envs.fc.check import to_json_schema
from trace_core.envs.math.answers import extract_boxed, gsm8k_final
from trace_core.envs.math.calculator import calculate
from trace_core.registry import Registry

Loader = Callable[..., list[Task]]
LOADERS: Registry[Loader] = Registry("loader")


def register_loader(name: str) -> Callable[[Loader], Loader]:
    return LOADERS.register(name)


def load_tasks(fmt: str, path: str | Path, **kw: Any) -> list[Task]:
    """``load_tasks("gsm8k", "data/gsm8k/test.jsonl", limit=500)``."""
    return LOADERS.get_item(fmt)(path, **kw)


class BadRow(ValueError):
    """A record that cannot become a task; the message names the file and line (or record)."""


def _locate(path: Path, n: int, lines: bool) -> str:
    return f"{path}:{n}" if lines else f"{path} record {n}"


#: Bounds on a data file (documented in README "Data"): a file is a regular file of at most
#: MAX_FILE_BYTES (HotpotQA's train split, the largest here, is ~0.6 GB); a JSON line at most
#: MAX_ROW_BYTES (a HotpotQA row with its paragraphs is ~10 KB); a question at most
#: MAX_QUESTION_CHARS characters. A row past a bound is a bad row, not a bad file.
MAX_FILE_BYTES = 2 << 30
MAX_ROW_BYTES = 1 << 20
MAX_QUESTION_CHARS = 20_000


def check_data_file(path: str | Path) -> Path:
    """``path`` if it is a regular file (a symlink's target too) within ``MAX_FILE_BYTES``;
    ``OSError`` naming it otherwise (a FIFO would block, ``/dev/zero`` never ends)."""
    import os
    import stat

    path = Path(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path} is not a regular file (a device, FIFO or socket)")
    if st.st_size > MAX_FILE_BYTES:
        raise OSError(f"{path} is {st.st_size} bytes; a data file is at most {MAX_FILE_BYTES}")
    return path


def _json_line(line: bytes) -> Any:
    """One JSON line, or a ``BadRow`` saying why not (oversized, not UTF-8, not JSON, a number
    past Python's 4300-digit limit, nested too deeply)."""
    if len(line) > MAX_ROW_BYTES:
        return BadRow(f"row of {len(line)} bytes; a row is at most {MAX_ROW_BYTES}")
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        return BadRow(f"not UTF-8 (byte {err.start})")
    except json.JSONDecodeError as err:
        return BadRow(f"not JSON ({err.msg})")
    except (ValueError, RecursionError) as err:
        return BadRow(f"not JSON ({' '.join(str(err).split())[:120]})")


def iter_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for every record of a ``.parquet``, ``.jsonl`` or ``.json`` file, in
    order; ``where`` is ``file:line`` (JSON lines) or ``file record n`` (array / Parquet, 1-based).
    A line that is not JSON (or not UTF-8, or over ``MAX_ROW_BYTES``) yields ``(where, BadRow)``
    instead of stopping the file."""
    path = check_data_file(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for n, rec in enumerate(pq.read_table(path).to_pylist(), 1):
            yield _locate(path, n, False), rec
        return
    raw = path.read_bytes()
    if path.suffix == ".json":
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # BFCL's .json files are JSON lines (or a bad byte)
            obj = None
        if obj is not None:
            if isinstance(obj, dict) and isinstance(obj.get("data"), list):
                obj = obj["data"]
            for n, rec in enumerate(obj if isinstance(obj, list) else [obj], 1):
                yield _locate(path, n, False), rec
            return
    for n, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            yield _locate(path, n, True), _json_line(line)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``.parquet``, ``.jsonl`` or ``.json`` (array, ``{"data": [...]}`` or JSON lines)."""
    out = []
    for where, rec in iter_records(path):
        if isinstance(rec, BadRow):
            raise BadRow(f"{where}: {rec}")
        out.append(rec)
    return out


#: Per-record converters ``row(record, index) -> Task | None`` (None: skipped by the format's own
#: rule, e.g. an unanswerable MuSiQue question). Any exception is a bad row.
RowLoader = Callable[[dict[str, Any], int], "Task | None"]
ROW_LOADERS: Registry[RowLoader] = Registry("row loader")


def _why(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f"missing field {err.args[0]!r}" if err.args else "missing field"
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def load_rows(fmt: str, path: str | Path, *, limit: int | None = None,
              on_bad: str = "error") -> tuple[list[Task], list[str]]:
    """``(tasks, problems)`` of a file in a per-record format (``ROW_LOADERS``). A bad record
    (not JSON, missing or mistyped field, empty question or answer) raises ``BadRow`` naming the
    file and line with ``on_bad="error"``; with ``"skip"`` it is left out and described in
    ``problems`` (``"file:line: why"``)."""
    row = ROW_LOADERS.get_item(fmt)
    tasks: list[Task] = []
    problems: list[str] = []
    for i, (where, rec) in enumerate(iter_records(path)):
        if limit is not None and len(tasks) >= limit:
            break
        try:
            if isinstance(rec, BadRow):
                raise rec
            if not isinstance(rec, dict):
                raise BadRow(f"a {fmt} record must be a JSON object, got {type(rec).__name__}")
            _check_text(rec)
            task = row(rec, i)
            if task is not None and not (isinstance(task.question, str) and task.question.strip()):
                raise BadRow("empty question")
            if task is not None and len(task.question) > MAX_QUESTION_CHARS:
                raise BadRow(f"question of {len(task.question)} characters; at most {MAX_QUESTION_CHARS}")
        except Exception as err:  # noqa: BLE001 - a row is data: any failure is a bad row
            msg = f"{where}: bad {fmt} row: {err if isinstance(err, BadRow) else _why(err)}"
            if on_bad == "error":
                raise BadRow(msg) from None
            problems.append(msg)
            continue
        if task is not None:
            tasks.append(task)
    return tasks, problems


def _check_text(rec: Any) -> None:
    """Every string of the record is valid Unicode text (a lone surrogate such as ``\\ud800``,
    legal in JSON, cannot be written to a shard)."""
    try:
        json.dumps(rec, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError as err:
        raise BadRow(f"text holds a lone surrogate (character {err.start})") from None
    except (ValueError, RecursionError) as err:
        raise BadRow(f"record cannot be read as text ({type(err).__name__})") from None


def _need(value: Any, what: str) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool) or not str(value).strip():
        raise BadRow(f"empty or non-scalar {what}")
    return str(value)


@ROW_LOADERS.register("gsm8k")
def gsm8k_row(r: dict[str, Any], i: int) -> Task:
    text = _need(r["answer"], "answer")
    exprs = [m.split("=")[0] for m in re.findall(r"<<([^<>]*)>>", text)]
    steps = [e for e in exprs if calculate(e)[1] == "ok"]
    final = gsm8k_final(text) if "####" in text else ""
    return Task(f"gsm8k-{r.get('id', i)}", "math", min(3, max(0, len(exprs) - 2)), _need(r["question"], "question"),
                {"answer": _need(final, "final answer (after ####)"), "steps": steps, "source": "gsm8k"})


@ROW_LOADERS.register("math")
def math_row(r: dict[str, Any], i: int) -> Task:
    answer = r.get("answer") or extract_boxed(str(r.get("solution", ""))) or ""
    m = re.search(r"\d", str(r.get("level", "")))
    level = int(m.group()) if m else 3
    return Task(f"math-{r.get('unique_id', r.get('id', i))}", "math", {1: 0, 2: 0, 3: 1, 4: 2}.get(level, 3),
                _need(r["problem"], "problem"),
                {"answer": _need(answer, "answer (field or last \\boxed{})"), "source": "math",
                 "subject": str(r.get("type", ""))})


@ROW_LOADERS.register("hotpotqa")
def hotpotqa_row(r: dict[str, Any], i: int) -> Task:
    paras = [[str(t), " ".join(str(s) for s in sents)] for t, sents in r["context"]]
    hops = list(dict.fromkeys(str(t) for t, _ in r.get("supporting_facts", [])))
    level = {"easy": 0, "medium": 1, "hard": 2}.get(r.get("level", ""), 1)
    return Task(f"hotpotqa-{r.get('_id', i)}", "qa", level, _need(r["question"], "question"),
                {"answers": [_need(r["answer"], "answer")], "paragraphs": paras, "show_titles": True, "hops": hops,
                 "source": "hotpotqa"})


@ROW_LOADERS.register("musique")
def musique_row(r: dict[str, Any], i: int) -> Task | None:
    if r.get("answerable", True) is False:
        return None
    paras = [[str(p["title"]), str(p["paragraph_text"])] for p in r["paragraphs"]]
    by_idx = {p.get("idx", j): p["title"] for j, p in enumerate(r["paragraphs"])}
    steps = r.get("question_decomposition", [])
    hops = [by_idx[s["paragraph_support_idx"]] for s in steps if s.get("paragraph_support_idx") in by_idx]
    aliases = [str(a) for a in r.get("answer_aliases", [])]
    return Task(f"musique-{r.get('id', i)}", "qa", min(3, max(0, len(steps) - 1)), _need(r["question"], "question"),
                {"answers": [_need(r["answer"], "answer"), *aliases], "paragraphs": paras,
                 "show_titles": True, "hops": hops, "source": "musique"})


def _from_rows(fmt: str) -> Loader:
    def load(path: str | Path, limit: int | None = None) -> list[Task]:
        return load_rows(fmt, path, limit=limit)[0]

    load.__name__ = load.__qualname__ = f"load_{fmt}"
    load.__doc__ = f"Every {fmt} record of ``path`` as a task (a bad record raises ``BadRow`` with file:line)."
    return load


load_gsm8k = register_loader("gsm8k")(_from_rows("gsm8k"))
load_math = register_loader("math")(_from_rows("math"))
load_hotpotqa = register_loader("hotpotqa")(_from_rows("hotpotqa"))
load_musique = register_loader("musique")(_from_rows("musique"))


def _fc_difficulty(n_functions: int, n_calls: int) -> int:
    return min(3, n_calls) if n_calls > 1 else int(n_functions > 1)


load_bfcl = register_loader("bfcl")(load_bfcl)  # categories, rules and refusals: trace_core/envs/fc/bfcl.py


def _xlam_type(t: str) -> str | None:
    base = t.split(",")[0].strip().lower()
    if base.startswith(("list", "tuple")):
        return "array"
    if base.startswith("dict"):
        return "object"
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(base)


def xlam_tool(tool: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """xLAM tool -> (BFCL-style schema, required names). Optional = ', optional' type or a default."""
    props, required = {}, []
    for name, spec in (tool.get("parameters") or {}).items():
        t = str(spec.get("type", ""))
        props[name] = {"description": spec.get("description", "")}
        if _xlam_type(t):
            props[name]["type"] = _xlam_type(t)
        if "optional" not in t and "default" not in spec:
            required.append(name)
    schema = {"name": tool["name"], "description": tool.get("description", ""),
              "parameters": to_json_schema({"type": "dict", "properties": props, "required": required})}
    return schema, required


@ROW_LOADERS.register("xlam")
def xlam_row(r: dict[str, Any], i: int) -> Task:
    tools = json.loads(r["tools"]) if isinstance(r["tools"], str) else r["tools"]
    calls = json.loads(r["answers"]) if isinstance(r["answers"], str) else r["answers"]
    by_name = {t["name"]: t for t in tools}
    gt = []
    for c in calls:
        params = (by_name.get(c["name"], {}).get("parameters") or {})
        spec = {a: [as_possible_answer(v)] for a, v in c["arguments"].items()}  # BFCL's form for dicts
        for p, ps in params.items():
            if p not in spec:
                spec[p] = ["", ps["default"]] if "default" in ps else [""]
        gt.append({c["name"]: spec})
    schemas = [xlam_tool(t)[0] for t in tools]
    return Task(f"xlam-{r.get('id', i)}", "fc", _fc_difficulty(len(tools), len(gt)), _need(r["query"], "query"),
                {"mode": "static", "functions": schemas, "ground_truth": gt, "source": "xlam"})


load_xlam = register_loader("xlam")(_from_rows("xlam"))
