"""smt_check: a reply's assignment is checked by z3 against the row's SMT-LIB2 constraints; expressions,
injected SMT text, missing, unknown or repeated names and huge integers are refused, and an unsatisfiable
problem never pays."""
import threading

import pytest

from lmrl.rewards import REWARD_FNS
from lmrl.rewards.constraints import AssignmentRefused, declared_variables, parse_assignment
from lmrl.types import Sample

SMT = """(declare-const x Int)
(declare-const y Int)
(assert (= (+ x y) 1))
(assert (> x y))
(assert (< x 10))
(check-sat)"""
UNSAT = "(declare-const x Int)\n(assert (> x 5))\n(assert (< x 3))"
BOOLS = "(declare-const p Bool)\n(declare-fun n () Int)\n(assert (=> p (> n 2)))\n(assert p)"
smt_check = REWARD_FNS.get("smt_check")


def score(text, smt=SMT, **params):
    s = Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row={"smt": smt})
    return smt_check(s, **params), s.info.get("smt_check")


def test_a_satisfying_assignment_scores_one_on_the_last_line_or_after_answer():
    assert score("x + y = 1 and x > y, so\nx = 3, y = -2") == (1.0, "sat")
    assert score("Answer: y = -2; x = 3.") == (1.0, "sat")
    assert score("x = 1, y = 0") == (1.0, "sat")
    assert score("p = true, n = 3", smt=BOOLS) == (1.0, "sat")


def test_an_assignment_that_breaks_a_constraint_scores_zero():
    assert score("x = 0, y = 1") == (0.0, "unsat")  # x > y fails
    assert score("x = 12, y = -11") == (0.0, "unsat")  # x < 10 fails
    assert score("p = true, n = 2", smt=BOOLS) == (0.0, "unsat")


def test_an_unsatisfiable_problem_never_pays():
    for value in ["4", "0", "-100", "5", "3", "6"]:
        assert score(f"x = {value}", smt=UNSAT)[0] == 0.0


@pytest.mark.parametrize("reply,reason", [
    ("x = 3", "no value for y"),
    ("x = 3, y = -2, z = 0", "'z' is not a variable"),
    ("x = 3, X = -2", "'X' is not a variable"),
    ("x = 3, y = -2, x = 3", "'x' is assigned twice"),
    ("x = y + 5, y = -2", "is not `name = integer literal`"),
    ("x = 3) (assert true, y = -2", "is not `name = integer literal`"),
    ("x = 3)) (assert (= y y, y = -2", "is not `name = integer literal`"),
    ("x = 3.0, y = -2", "is not `name = integer literal`"),
    ("x = +3, y = -2", "is not `name = integer literal`"),
    ("x = 03, y = -2", "is not `name = integer literal`"),
    ("x = 3e0, y = -2", "is not `name = integer literal`"),
    ("x = three, y = -2", "is not `name = integer literal`"),
    ("x = (- 3), y = -2", "is not `name = integer literal`"),
    ("x = 3, y = true", "'y' is Int, not 'true'"),
    ("x = 1" + "0" * 40 + ", y = -2", "an integer over 30 digits"),
])
def test_refused_assignments_score_zero_and_say_why(reply, reason):
    value, info = score(reply)
    assert value == 0.0 and info.startswith("refused:") and reason in info


def test_injected_smt_cannot_add_or_drop_constraints():
    # would satisfy only if the text reached the solver as SMT: x = 0, y = 1 breaks x > y
    for reply in ["x = 0, y = 1) (reset) (declare-const x Int", "x = 0, y = 1 (assert true)",
                  "x = 0, y = |1|", "x = 0, y = 1\n(assert false)"]:
        assert score(reply)[0] == 0.0
    with pytest.raises(AssignmentRefused):
        parse_assignment("x = 0 ; (check-sat)", {"x": "Int"})


def test_the_digit_cap_is_a_knob():
    assert score("x = 5, y = -4", max_digits=1)[0] == 1.0
    assert score("x = 5, y = -40", max_digits=1)[0] == 0.0


def test_declarations_the_reward_cannot_assign_are_a_clear_error():
    assert declared_variables(BOOLS) == {"p": "Bool", "n": "Int"}
    for smt in ["(declare-const r Real)\n(assert (> r 0))", "(declare-fun f (Int) Int)", "(assert true)",
                "(declare-const |a b| Int)"]:
        with pytest.raises(ValueError, match="smt_check: the row's problem"):
            score("r = 1", smt=smt)
    with pytest.raises(ValueError, match="not valid SMT-LIB2"):
        score("x = 1", smt="(declare-const x Int)\n(assert (> x undefined_name))")
    with pytest.raises(ValueError, match="needs the problem as SMT-LIB2 text"):
        score("x = 1", smt=None)


def test_threads_score_independently():
    results = []

    def run(reply, want):
        results.append(score(reply)[0] == want)

    threads = [threading.Thread(target=run, args=(("x = 3, y = -2", 1.0) if i % 2 else ("x = 0, y = 1", 0.0)))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 8
