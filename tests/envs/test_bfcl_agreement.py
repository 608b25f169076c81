"""Our AST rule agrees with BFCL's own checker on BFCL's data, correct and perturbed calls.

Needs the unpacked ``bfcl-eval`` wheel: ``scripts/fetch-bfcl-eval.sh`` (default folder
``~/.cache/trace-rl/bfcl-eval``, or ``TRACE_BFCL_EVAL_DIR``). Per-category figures:
``python benchmarks/learning/verifier_agreement.py``.
"""

import json
import random

import pytest

from tests.envs.bfcl_reference import agreement, correct_calls, has_nested, load_reference, reference_dir
from trace_core.envs import make_env, replay
from trace_core.envs.actions import parse_action
from trace_core.envs.fc.bfcl import AST_CATEGORIES, RELEVANCE_CATEGORIES, category_file, unsolvable
from trace_core.envs.fc.check import ast_match
from trace_core.envs.loaders import load_tasks
from trace_core.envs.synthetic import demonstration

ROOT = reference_dir()
pytestmark = pytest.mark.skipif(
    ROOT is None, reason="BFCL's checker is not unpacked: run scripts/fetch-bfcl-eval.sh "
                         "(or set TRACE_BFCL_EVAL_DIR to a folder it filled)")


@pytest.fixture(scope="module")
def reference():
    return load_reference(ROOT)


@pytest.mark.parametrize("category", AST_CATEGORIES)
def test_agrees_with_bfcl_checker(reference, category):
    res = agreement(reference, ROOT / "bfcl_eval" / "data", category)
    print(f"{category}: {res.agree}/{res.cases} agree ({res.rate:.2%}) on {res.tasks} tasks, "
          f"{res.accepted_by_both} accepted by both, nested-dict answers accepted {res.nested_accepted}/"
          f"{res.nested_tasks}, disagreements {dict(res.disagreements)}")
    assert res.tasks > 10 and res.cases > 30 * res.tasks
    assert res.rate >= 0.995, res.examples
    assert res.accepted_by_both > 0.2 * res.cases  # correct variants really are accepted
    assert res.nested_accepted == res.nested_tasks  # every nested-dict answer solvable
    assert res.precheck_blocks_valid == 0  # the env's argument pre-check never refuses a call BFCL accepts
    assert res.reference_errors == 0


def test_nested_dict_answers_exist_and_are_accepted(reference):
    """Every task whose possible answer holds a nested dict: the correct call passes both checkers."""
    from bfcl_eval.constants.enums import Language

    nested = accepted = 0
    for category in AST_CATEGORIES:
        for t in load_tasks("bfcl", ROOT / "bfcl_eval" / "data", category=category):
            p = t.payload
            if not has_nested(p["ground_truth"]):
                continue
            calls = correct_calls(p["ground_truth"], None)
            ours = ast_match(calls, p["ground_truth"], p["functions"])[1]
            theirs = reference.ast_checker(p["functions"], [{n: a} for n, a in calls], p["ground_truth"],
                                           Language.PYTHON, category, "any-model")["valid"]
            nested += 1
            accepted += ours and theirs
    assert nested >= 30 and accepted == nested


@pytest.mark.parametrize("category", [*AST_CATEGORIES, *RELEVANCE_CATEGORIES])
def test_every_task_loads_and_its_demo_solves_it(reference, category):
    """Every loaded task is solvable: its demonstration earns reward 1 in the env and BFCL's checker
    accepts the same calls (the few tasks no call can solve are left out by the loader)."""
    from bfcl_eval.constants.enums import Language

    tasks = load_tasks("bfcl", ROOT / "bfcl_eval" / "data", category=category)
    assert tasks and all(t.prompt_id.startswith(f"bfcl-{category}_") for t in tasks)
    assert len(tasks) >= 0.99 * sum(1 for line in open(category_file(ROOT / "bfcl_eval" / "data", category)))
    env = make_env("fc")
    failed = []
    for t in tasks:
        demo = demonstration(t)
        if replay(env, t, demo)[1][-1].reward != 1.0:
            failed.append(t.prompt_id)
        elif category in AST_CATEGORIES:
            calls = [{a.name: a.arguments} for a in map(parse_action, demo)]
            p = t.payload
            if not reference.ast_checker(p["functions"], calls, p["ground_truth"], Language.PYTHON, category,
                                         "any-model")["valid"]:
                failed.append(t.prompt_id + " (BFCL)")
    assert failed == []


def test_left_out_tasks_are_unsolvable_for_bfcl_too(reference):
    """The loader's ``unsolvable`` tasks: BFCL's checker accepts none of the calls tried on them."""
    from bfcl_eval.constants.enums import Language

    data = ROOT / "bfcl_eval" / "data"
    left_out = 0
    for category in AST_CATEGORIES:
        answers = {json.loads(line)["id"]: json.loads(line)["ground_truth"]
                   for line in open(data / "possible_answer" / category_file(data, category).name)}
        for line in open(category_file(data, category)):
            r = json.loads(line)
            gt = answers[r["id"]]
            if unsolvable(r["function"], gt) is None:
                continue
            left_out += 1
            rng = random.Random(0)
            tries = [correct_calls(gt, None)] + [correct_calls(gt, rng) for _ in range(20)]
            for calls in tries:
                out = [{n: a} for n, a in calls]
                assert not reference.ast_checker(r["function"], out, gt, Language.PYTHON, category, "m")["valid"]
    assert 0 < left_out <= 10
