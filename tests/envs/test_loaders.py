"""Loaders read the project's sample files (JSONL / JSON / Parquet / BFCL dir) and their demos replay."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trace_core
from trace_core.envs import make_env, replay
from trace_core.envs.loaders import LOADERS, load_tasks, read_records
from trace_core.envs.synthetic import demonstration

SAMPLES = Path(trace_core.__file__).parent / "data" / "samples"
CASES = [("gsm8k", "gsm8k.jsonl", {}, 5), ("math", "math.jsonl", {}, 5), ("hotpotqa", "hotpotqa.json", {}, 3),
         ("musique", "musique.jsonl", {}, 2), ("bfcl", "bfcl", {}, 3), ("bfcl", "bfcl", {"category": "parallel"}, 1),
         ("xlam", "xlam.json", {}, 3)]


@pytest.mark.parametrize(("fmt", "name", "kw", "n"), CASES)
def test_loader_reads_samples_and_demo_is_correct(fmt, name, kw, n):
    tasks = load_tasks(fmt, SAMPLES / name, **kw)
    assert len(tasks) == n and len({t.prompt_id for t in tasks}) == n
    for t in tasks:
        assert t.question and 0 <= t.difficulty <= 3
        res = replay(make_env(t.family), t, demonstration(t))[1]
        assert res[-1].done and res[-1].reward == 1.0, (t.prompt_id, res)


def test_answers_extracted():
    assert [t.payload["answer"] for t in load_tasks("gsm8k", SAMPLES / "gsm8k.jsonl")] == \
        ["14", "36", "600", "1500", "26"]
    assert load_tasks("math", SAMPLES / "math.jsonl")[0].payload["answer"] == "\\frac{7}{8}"
    assert load_tasks("musique", SAMPLES / "musique.jsonl")[0].payload["answers"] == ["Lodra", "Lodra City"]


@pytest.mark.parametrize(("fmt", "name"), [("gsm8k", "gsm8k.jsonl"), ("math", "math.jsonl"),
                                           ("musique", "musique.jsonl")])
def test_parquet_round_trip(tmp_path, fmt, name):
    rows = read_records(SAMPLES / name)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    a = load_tasks(fmt, SAMPLES / name)
    b = load_tasks(fmt, tmp_path / "x.parquet")
    assert [(t.question, t.payload["answers" if fmt == "musique" else "answer"]) for t in a] == \
        [(t.question, t.payload["answers" if fmt == "musique" else "answer"]) for t in b]


def test_bfcl_missing_dir_and_limit(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tasks("bfcl", tmp_path)
    assert len(load_tasks("gsm8k", SAMPLES / "gsm8k.jsonl", limit=2)) == 2
    with pytest.raises(KeyError, match="known"):
        load_tasks("squad", tmp_path)
    assert set(LOADERS) == {"gsm8k", "math", "hotpotqa", "musique", "bfcl", "xlam"}


def test_bfcl_wrong_calls_scored_by_ast_rule():
    t = load_tasks("bfcl", SAMPLES / "bfcl")[1]  # currency_convert
    env = make_env("fc")
    call = '<tool_call>{"name": "currency_convert", "arguments": %s}</tool_call>'
    good = call % json.dumps({"amount": 50, "from_currency": "euro", "to_currency": "Yen"})
    assert replay(env, t, [good])[1][-1].reward == 1.0
    wrong = call % json.dumps({"amount": 60, "from_currency": "EUR", "to_currency": "JPY"})
    assert replay(env, t, [wrong])[1][-1].reason == "wrong_call"
    bad = replay(env, t, [call % json.dumps({"amount": "50"})])[1][0]
    assert bad.reason == "bad_arguments" and not bad.done
    assert replay(env, t, ["<answer>no</answer>"])[1][-1].reason == "no_call"
    full = env.reset(t).messages()[0]["content"]
    compact = make_env("fc").reset(t).messages()[0]["content"]
    assert compact.startswith("tools: currency_convert(amount, from_currency, to_currency)")
    assert '"type": "object"' in make_env("fc", prompt_style="full").reset(t).messages()[0]["content"]
    assert full == compact
