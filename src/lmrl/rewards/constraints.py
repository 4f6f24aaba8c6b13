"""Constraint problems checked by an SMT solver: the reply assigns a value to every variable the row's
SMT-LIB2 problem declares, and z3 decides whether the constraints hold under that assignment.

A stand-in for verifier rewards of the Dafny kind (the policy's output is accepted only if a solver proves it
right): confidence: medium — the reward shape of such methods, not a reconstruction of one paper. The reply is
parsed, never evaluated: each value must be a plain integer literal (or true/false for a Bool), and it enters
the solver as a z3 value built in Python, never as SMT text, so nothing in the reply can add a constraint.
The rules: docs/rewards/smt_check.md.
"""
from __future__ import annotations

import re

from lmrl.rewards.answers import extract_answer
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample

MAX_DIGITS = 30  # a longer integer literal is refused
SOLVER_TIMEOUT_MS = 2000
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_DECLARATION = re.compile(rf"\(\s*declare-(?:const\s+({_NAME})|fun\s+({_NAME})\s*\(\s*\))\s+(Int|Bool)\s*\)")
_ANY_DECLARATION = re.compile(r"\(\s*declare-(?:const|fun)\s+(\S+)")
_ITEM = re.compile(rf"^({_NAME})\s*=\s*(-?(?:0|[1-9][0-9]*)|true|false)$")


class AssignmentRefused(ValueError):
    """A reply whose assignment the grader does not accept (the reason is the message)."""


def declared_variables(smt: str) -> dict[str, str]:
    """Name -> sort ("Int" or "Bool") of every constant the problem declares; a ValueError for a declaration
    of another kind (a function with arguments, another sort, a quoted |name|), which this reward cannot assign."""
    found = {m.group(1) or m.group(2): m.group(3) for m in _DECLARATION.finditer(smt)}
    every = _ANY_DECLARATION.findall(smt)
    if len(every) != len(found):
        raise ValueError("smt_check: the row's problem may declare only Int or Bool constants with plain names "
                         f"({_NAME}), e.g. (declare-const x Int); it declares {every}")
    if not found:
        raise ValueError("smt_check: the row's problem declares no variable, e.g. (declare-const x Int)")
    return found


def assignment_text(reply: str) -> str:
    """The reply's assignment: the text after its last 'Answer:' marker, else its last non-empty line."""
    marked = extract_answer(reply)
    if marked is not None:
        return marked
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def parse_assignment(text: str, variables: dict[str, str], max_digits: int = MAX_DIGITS) -> dict[str, int | bool]:
    """`x = 3, y = -2` (items separated by commas or semicolons) as {name: value}, or AssignmentRefused: an
    item that is not `name = literal`, a name the problem does not declare, a name given twice, a declared
    name left out, a literal of the wrong sort, or an integer longer than `max_digits` digits."""
    values: dict[str, int | bool] = {}
    for item in (part.strip() for part in re.split(r"[,;]", text.strip().rstrip("."))):
        m = _ITEM.match(item)
        if m is None:
            raise AssignmentRefused(f"{item[:40]!r} is not `name = integer literal`")
        name, literal = m.groups()
        if name not in variables:
            raise AssignmentRefused(f"{name!r} is not a variable of the problem")
        if name in values:
            raise AssignmentRefused(f"{name!r} is assigned twice")
        if (literal in ("true", "false")) != (variables[name] == "Bool"):
            raise AssignmentRefused(f"{name!r} is {variables[name]}, not {literal!r}")
        if len(literal.lstrip("-")) > max_digits:
            raise AssignmentRefused(f"{name!r}: an integer over {max_digits} digits")
        values[name] = literal == "true" if variables[name] == "Bool" else int(literal)
    missing = sorted(set(variables) - set(values))
    if missing:
        raise AssignmentRefused(f"no value for {', '.join(missing)}")
    return values


def satisfied(smt: str, variables: dict[str, str], values: dict[str, int | bool],
              timeout_ms: int = SOLVER_TIMEOUT_MS) -> str:
    """z3's verdict ("sat", "unsat" or "unknown") on the problem's assertions with each variable fixed to its
    value, in a context of its own (z3's default context is shared by threads)."""
    import z3

    ctx = z3.Context()
    solver = z3.Solver(ctx=ctx)
    solver.set("timeout", timeout_ms)
    try:
        solver.add(z3.parse_smt2_string(smt, ctx=ctx))
    except z3.Z3Exception as err:
        raise ValueError(f"smt_check: the row's problem is not valid SMT-LIB2: {err}") from None
    for name, value in values.items():
        if variables[name] == "Bool":
            solver.add(z3.Bool(name, ctx) == z3.BoolVal(value, ctx))
        else:
            solver.add(z3.Int(name, ctx) == z3.IntVal(value, ctx))
    return str(solver.check())


@REWARD_FNS.register("smt_check", "1 if the reply's assignment of every declared variable satisfies the row's "
                                  "SMT-LIB2 constraints (z3)")
def smt_check_reward(sample: Sample, smt_field: str = "smt", max_digits: int = MAX_DIGITS,
                     timeout_ms: int = SOLVER_TIMEOUT_MS) -> float:
    """1 when z3 finds the constraints satisfied with every declared variable fixed to the reply's value; 0
    when they are not, when the solver cannot tell in `timeout_ms`, or when the reply's assignment is refused
    (`parse_assignment`). The verdict or the refusal is kept in `sample.info["smt_check"]`."""
    smt = sample.row.get(smt_field)
    if not isinstance(smt, str) or not smt.strip():
        raise ValueError(f"smt_check needs the problem as SMT-LIB2 text in the row's {smt_field!r} field "
                         "(set params.smt_field)")
    variables = declared_variables(smt)
    try:
        values = parse_assignment(assignment_text(sample.text), variables, max_digits)
    except AssignmentRefused as err:
        sample.info["smt_check"] = f"refused: {err}"
        return 0.0
    verdict = satisfied(smt, variables, values, timeout_ms)
    sample.info["smt_check"] = verdict
    return float(verdict == "sat")
