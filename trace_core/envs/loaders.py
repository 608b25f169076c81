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
* BFCL     a directory with ``BFCL_v*_<category>.json`` (JSON lines: ``{id, question: [[{role,
  content}]], function: [schemas]}``) and ``possible_answer/BFCL_v*_<category>.json``
  (``{id, ground_truth: [{fn: {arg: [allowed]}}]}``). Single-turn categories only.
* xLAM     ``{id, query, tools, answers}`` (``tools`` / ``answers`` lists or JSON strings).

Getting BFCL data offline, without depending on ``bfcl-eval`` (its requirements pin
``numpy==1.26.4`` and pull dozens of SDKs) and without copying its data into this repository::

    pip download --no-deps bfcl-eval -d /tmp/bfcl && cd /tmp/bfcl && unzip -q bfcl_eval-*.whl
    # data: /tmp/bfcl/bfcl_eval/data  (BFCL_v4_simple_python.json, possible_answer/, ...)
    # or: pip install --no-deps --target /tmp/bfcl bfcl-eval  # never imported; same data folder

then ``load_bfcl("/tmp/bfcl/bfcl_eval/data", "simple_python")``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_core.envs.base import Task
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


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``.parquet``, ``.jsonl`` or ``.json`` (array, ``{"data": [...]}`` or JSON lines)."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            obj = json.loads(text)
            if isinstance(obj, dict) and isinstance(obj.get("data"), list):
                obj = obj["data"]
            return obj if isinstance(obj, list) else [obj]
        except json.JSONDecodeError:
            pass  # BFCL's .json files are JSON lines
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _limit(records: list, limit: int | None) -> list:
    return records if limit is None else records[:limit]


@register_loader("gsm8k")
def load_gsm8k(path: str | Path, limit: int | None = None) -> list[Task]:
    tasks = []
    for i, r in enumerate(_limit(read_records(path), limit)):
        exprs = [m.split("=")[0] for m in re.findall(r"<<([^<>]*)>>", r["answer"])]
        steps = [e for e in exprs if calculate(e)[1] == "ok"]
        tasks.append(Task(f"gsm8k-{r.get('id', i)}", "math", min(3, max(0, len(exprs) - 2)), r["question"],
                          {"answer": gsm8k_final(r["answer"]), "steps": steps, "source": "gsm8k"}))
    return tasks


@register_loader("math")
def load_math(path: str | Path, limit: int | None = None) -> list[Task]:
    tasks = []
    for i, r in enumerate(_limit(read_records(path), limit)):
        answer = r.get("answer") or extract_boxed(r.get("solution", "")) or ""
        m = re.search(r"\d", str(r.get("level", "")))
        level = int(m.group()) if m else 3
        tasks.append(Task(f"math-{r.get('unique_id', r.get('id', i))}", "math", {1: 0, 2: 0, 3: 1, 4: 2}.get(level, 3),
                          r["problem"], {"answer": answer, "source": "math", "subject": r.get("type", "")}))
    return tasks


@register_loader("hotpotqa")
def load_hotpotqa(path: str | Path, limit: int | None = None) -> list[Task]:
    tasks = []
    for i, r in enumerate(_limit(read_records(path), limit)):
        paras = [[str(t), " ".join(str(s) for s in sents)] for t, sents in r["context"]]
        hops = list(dict.fromkeys(str(t) for t, _ in r.get("supporting_facts", [])))
        level = {"easy": 0, "medium": 1, "hard": 2}.get(r.get("level", ""), 1)
        tasks.append(Task(f"hotpotqa-{r.get('_id', i)}", "qa", level, r["question"],
                          {"answers": [r["answer"]], "paragraphs": paras, "show_titles": True, "hops": hops,
                           "source": "hotpotqa"}))
    return tasks


@register_loader("musique")
def load_musique(path: str | Path, limit: int | None = None) -> list[Task]:
    tasks = []
    for i, r in enumerate(_limit(read_records(path), limit)):
        if r.get("answerable", True) is False:
            continue
        paras = [[p["title"], p["paragraph_text"]] for p in r["paragraphs"]]
        by_idx = {p.get("idx", j): p["title"] for j, p in enumerate(r["paragraphs"])}
        steps = r.get("question_decomposition", [])
        hops = [by_idx[s["paragraph_support_idx"]] for s in steps if s.get("paragraph_support_idx") in by_idx]
        tasks.append(Task(f"musique-{r.get('id', i)}", "qa", min(3, max(0, len(steps) - 1)), r["question"],
                          {"answers": [r["answer"], *r.get("answer_aliases", [])], "paragraphs": paras,
                           "show_titles": True, "hops": hops, "source": "musique"}))
    return _limit(tasks, limit)


def _fc_difficulty(n_functions: int, n_calls: int) -> int:
    return min(3, n_calls) if n_calls > 1 else int(n_functions > 1)


@register_loader("bfcl")
def load_bfcl(data_dir: str | Path, category: str = "simple_python", limit: int | None = None) -> list[Task]:
    """Single-turn BFCL category from a data directory the user names (see module docstring)."""
    data_dir = Path(data_dir)
    found = sorted(data_dir.glob(f"BFCL_v*_{category}.json"))
    if not found:
        raise FileNotFoundError(f"no BFCL_v*_{category}.json in {data_dir}")
    questions = read_records(found[-1])
    answers = {a["id"]: a["ground_truth"] for a in read_records(data_dir / "possible_answer" / found[-1].name)}
    tasks = []
    for r in _limit(questions, limit):
        turns = r["question"][0] if r["question"] and isinstance(r["question"][0], list) else r["question"]
        user = [m["content"] for m in turns if m.get("role") == "user"]
        gt = answers[r["id"]]
        tasks.append(Task(f"bfcl-{r['id']}", "fc", _fc_difficulty(len(r["function"]), len(gt)), user[-1],
                          {"mode": "static", "functions": r["function"], "ground_truth": gt, "source": "bfcl"}))
    return tasks


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


@register_loader("xlam")
def load_xlam(path: str | Path, limit: int | None = None) -> list[Task]:
    tasks = []
    for i, r in enumerate(_limit(read_records(path), limit)):
        tools = json.loads(r["tools"]) if isinstance(r["tools"], str) else r["tools"]
        calls = json.loads(r["answers"]) if isinstance(r["answers"], str) else r["answers"]
        by_name = {t["name"]: t for t in tools}
        gt = []
        for c in calls:
            params = (by_name.get(c["name"], {}).get("parameters") or {})
            spec = {a: [v] for a, v in c["arguments"].items()}
            for p, ps in params.items():
                if p not in spec:
                    spec[p] = ["", ps["default"]] if "default" in ps else [""]
            gt.append({c["name"]: spec})
        schemas = [xlam_tool(t)[0] for t in tools]
        tasks.append(Task(f"xlam-{r.get('id', i)}", "fc", _fc_difficulty(len(tools), len(gt)), r["query"],
                          {"mode": "static", "functions": schemas, "ground_truth": gt, "source": "xlam"}))
    return tasks
