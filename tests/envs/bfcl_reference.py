"""BFCL's own AST checker (from the unpacked ``bfcl-eval`` wheel) beside ours, on the same calls.

``reference_dir()``: ``$TRACE_BFCL_EVAL_DIR`` or ``~/.cache/trace-rl/bfcl-eval`` (what
``scripts/fetch-bfcl-eval.sh`` fills); None when the wheel is not unpacked there. The checker module
is imported from that folder with one stand-in: ``bfcl_eval.constants.model_config`` (the model
registry, which imports every provider SDK) becomes a mapping whose models keep dots in function
names — the only thing the checker reads from it. Nothing else of ``bfcl-eval`` runs, no network.

``agreement(data_dir, category)`` builds, for every task of the category, correct calls from the
possible answers (first and random allowed values, nested dicts per key, parallel calls shuffled)
and perturbed ones (wrong function, missing / extra arguments, wrong type, wrong value, nested
changes, case / punctuation variants of strings, int / float swaps, wrong call counts), and judges
each with both checkers.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import random
import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_core.envs.config import EnvConfig
from trace_core.envs.fc.ast_rule import find_schema
from trace_core.envs.fc.bfcl import AST_CATEGORIES, load_bfcl
from trace_core.envs.fc.check import ast_match
from trace_core.envs.fc.env import FCEnv, first_allowed

DEFAULT_DIR = Path.home() / ".cache" / "trace-rl" / "bfcl-eval"


def reference_dir() -> Path | None:
    root = Path(os.environ.get("TRACE_BFCL_EVAL_DIR") or DEFAULT_DIR)
    ok = (root / "bfcl_eval" / "eval_checker" / "ast_eval" / "ast_checker.py").is_file()
    return root if ok and (root / "bfcl_eval" / "data" / "possible_answer").is_dir() else None


class _KeepDots(dict):
    def __missing__(self, key: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(underscore_to_dot=False)


def load_reference(root: Path) -> Any:
    """BFCL's ``ast_checker`` module, imported from ``root`` (see module docstring)."""
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = _KeepDots()
    sys.modules["bfcl_eval.constants.model_config"] = stub
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    finally:
        sys.path.remove(str(root))


def _pick(allowed: list, rng: random.Random | None) -> tuple[bool, Any]:
    """(give it?, value): the first non-'' allowed value, or a random allowed one ('' = omit)."""
    if not allowed:
        return False, None
    if rng is None:
        given = [a for a in allowed if a != ""]
        return (True, first_allowed(given[0])) if given else (False, None)
    a = rng.choice(allowed)
    if a == "":
        return False, None
    if isinstance(a, dict) and a and all(isinstance(v, list) for v in a.values()):
        return True, _random_nested(a, rng)
    return True, first_allowed(a)


def _random_nested(a: dict, rng: random.Random) -> dict:
    """A random allowed value per key of a nested-dict answer ('' = leave the key out)."""
    picks = {k: rng.choice(v) for k, v in a.items() if v}
    return {k: v for k, v in picks.items() if v != ""}


def correct_calls(gt: list[dict], rng: random.Random | None) -> list[tuple[str, dict]]:
    calls = []
    for entry in gt:
        (fn, spec), = entry.items()
        args = {}
        for k, allowed in spec.items():
            give, v = _pick(allowed if isinstance(allowed, list) else [allowed], rng)
            if give:
                args[k] = v
        calls.append((fn, args))
    if rng is not None:
        rng.shuffle(calls)
    return calls


def _case_variants(s: str) -> list[str]:
    return [s.upper(), s.lower().replace(" ", "_"), s.replace(" ", "-") + ".", s.title().replace(" ", ""),
            s + "!", s.replace("'", '"'), " " + s + " ", s.replace(",", ";"), s + "'s", "^" + s + "*"]


def _wrong_type(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return 12345
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return "None"


def _wrong_value(v: Any) -> Any:
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v + (1 if isinstance(v, int) else 1.5)
    if isinstance(v, str):
        return v + " zz"
    if isinstance(v, list):
        return v[:-1] if v else [1]
    if isinstance(v, dict):
        return {**v, next(iter(v)): _wrong_value(next(iter(v.values())))} if v else {"k": 1}
    return 0


def _value_variants(v: Any) -> list[tuple[str, Any]]:
    out = [("wrong_type", _wrong_type(v)), ("wrong_value", _wrong_value(v)), ("null", None)]
    if isinstance(v, str):
        out += [("string_variant", s) for s in _case_variants(v)] + [("empty_string", "")]
    if isinstance(v, bool):
        out.append(("bool_as_int", int(v)))
    elif isinstance(v, int):
        out += [("int_as_float", float(v)), ("int_as_bool", bool(v))]
    elif isinstance(v, float):
        out += [("float_as_int", int(v))] if v == int(v) and abs(v) < 1e15 else [("float_rounded", round(v))]
    if isinstance(v, list):
        out += [("list_strings_upper", [x.upper() if isinstance(x, str) else x for x in v]), ("list_reversed", v[::-1]),
                ("list_as_float", [float(x) if type(x) is int else x for x in v]), ("empty_list", [])]
    if isinstance(v, dict):
        out.append(("empty_dict", {}))
    if isinstance(v, dict) and v:
        k = next(iter(v))
        out += [("nested_change", {**v, k: _wrong_value(v[k])}), ("nested_extra_key", {**v, "zz_key": 1}),
                ("nested_missing_key", {kk: vv for kk, vv in v.items() if kk != k}),
                ("nested_string_variant", {kk: (vv.upper() if isinstance(vv, str) else vv) for kk, vv in v.items()})]
    return out


TRICKY: list[Any] = [0, 0.0, 1, 1.0, -1, True, False, "", " ", "0", "none", None, [], [""], [0], [0.0], [None], {},
                     {"a": 1}, [{}], [[1]], "a'b", 'a"b', "A.B", 1e300, -0.0]


def perturbed_calls(calls: list[tuple[str, dict]], functions: list[dict], rng: random.Random
                    ) -> list[tuple[str, list[tuple[str, dict]]]]:
    out: list[tuple[str, list[tuple[str, dict]]]] = []
    i = rng.randrange(len(calls))
    name, args = calls[i]

    def with_call(n: str, a: dict) -> list[tuple[str, dict]]:
        c = copy.deepcopy(calls)
        c[i] = (n, a)
        return c

    others = [f["name"] for f in functions if f.get("name") != name]
    out.append(("wrong_function", with_call(others[0] if others else name + "_v2", args)))
    out.append(("wrong_function_suffix", with_call(name + "_v2", args)))
    schema = find_schema(functions, name) or {}
    params = schema.get("parameters", {})
    for r in params.get("required", [])[:2]:
        if r in args:
            out.append(("missing_required", with_call(name, {k: v for k, v in args.items() if k != r})))
    for k in list(args)[:2]:
        out.append(("missing_argument", with_call(name, {kk: v for kk, v in args.items() if kk != k})))
    out.append(("extra_argument", with_call(name, {**args, "zz_unexpected": 1})))
    unused = [p for p in params.get("properties", {}) if p not in args]
    if unused:
        out.append(("extra_schema_argument", with_call(name, {**args, unused[0]: "x"})))
    for k, v in list(args.items())[:4]:
        for kind, nv in _value_variants(v):
            out.append((kind, with_call(name, {**args, k: nv})))
    for k in rng.sample(list(args), min(2, len(args))):
        for nv in rng.sample(TRICKY, 4):
            out.append(("tricky_value", with_call(name, {**args, k: copy.deepcopy(nv)})))
    out.append(("no_calls", []))
    out.append(("duplicate_call", calls + [calls[i]]))
    if len(calls) > 1:
        out.append(("dropped_call", calls[:i] + calls[i + 1:]))
        out.append(("reversed_calls", calls[::-1]))
    return out


@dataclass
class Agreement:
    category: str
    tasks: int = 0
    cases: int = 0
    agree: int = 0
    reference_errors: int = 0
    accepted_by_both: int = 0
    nested_tasks: int = 0
    nested_accepted: int = 0
    precheck_blocks_valid: int = 0  # calls BFCL accepts that the env's argument pre-check would refuse
    disagreements: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.agree / max(1, self.cases)


def has_nested(gt: list[dict]) -> bool:
    return any(isinstance(a, dict) for e in gt for spec in e.values() for v in spec.values()
               for a in (v if isinstance(v, list) else [v]))


def agreement(ref: Any, data_dir: Path, category: str, seed: int = 0, limit: int | None = None) -> Agreement:
    """Both checkers on correct and perturbed calls of every task of one AST category."""
    assert category in AST_CATEGORIES, category
    from bfcl_eval.constants.enums import Language

    rng = random.Random(seed)
    res = Agreement(category)
    for task in load_bfcl(data_dir, category, limit=limit):
        p = task.payload
        functions, gt = p["functions"], p["ground_truth"]
        res.tasks += 1
        base = correct_calls(gt, None)
        cases = [("correct_first", base)] + [("correct_random", correct_calls(gt, rng)) for _ in range(2)]
        cases += perturbed_calls(base, functions, rng)
        episode = FCEnv(EnvConfig()).reset(task)
        nested = has_nested(gt)
        res.nested_tasks += nested
        for kind, calls in cases:
            out = [{n: copy.deepcopy(a)} for n, a in calls]
            try:
                theirs = bool(ref.ast_checker(copy.deepcopy(functions), out, gt, Language.PYTHON, category,
                                              "any-model")["valid"])
            except Exception:  # noqa: BLE001 - the reference crashing on an input is counted, not judged
                res.reference_errors += 1
                continue
            ours = ast_match(calls, gt, functions)[1]
            res.cases += 1
            res.agree += ours == theirs
            res.accepted_by_both += ours and theirs
            if theirs and any(n not in episode.tools or episode.validate(episode.tools[n], a) for n, a in calls):
                res.precheck_blocks_valid += 1
            if kind == "correct_first" and nested:
                res.nested_accepted += ours and theirs
            if ours != theirs:
                res.disagreements[kind] += 1
                if len(res.examples) < 5:
                    res.examples.append((task.prompt_id, kind, calls, gt, ours, theirs))
    return res
