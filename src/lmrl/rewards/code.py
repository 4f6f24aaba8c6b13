"""`code_tests`: the fraction of a task's unit tests that the model's code passes, run in the sandbox.

A row carries `test` (Python source defining `check(candidate)`, HumanEval style), `entry_point`
(the function under test) and optionally `prompt` (the code the model was asked to complete).

Partial credit: `check`'s body is split with `ast` into its top-level statements. Each statement
that contains an `assert` whose condition is not a constant is one test case (a `for` loop of
asserts is one case); the other statements (imports, helper variables, `assert True` notes) are
set-up and run in order between the cases, in one shared namespace, exactly as `check` would run
them. Every case runs under its own time limit and its verdict is reported on stdout, tagged with
a per-run random token that is never on disk; a case with no verdict (crash, timeout, `os._exit`)
counts as failed. If the process dies before the last case, the run resumes after the case it died
in (at most `max_restarts` times, within the overall `timeout_s`). With `partial_credit: false`
the reward is 1 when `check(candidate)` passes as a whole, else 0 (HumanEval's own grading).

A candidate that fails, hangs or crashes earns 0 for the cases it affected: that is a verdict, not
an error, so the sample is never excluded for it. A missing `test`/`entry_point` raises (the scorer
then excludes the sample, a configuration problem).
"""
from __future__ import annotations

import ast
import re
import secrets
import textwrap

from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.sandbox import run_python
from lmrl.types import Sample

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in a completion: the fenced block that defines `entry_point` (else the first
    python/unlabelled block, else the first block), or the raw text when there is no fence.
    An unclosed fence (a truncated reply) runs to the end of the text."""
    blocks = [(lang.lower(), body) for lang, body in FENCE.findall(text)]
    if not blocks:
        return text
    if entry_point:
        defining = [body for _, body in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", body, re.M)]
        if defining:
            return defining[0]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3", "")]
    return (python or [blocks[0][1]])[0]


def build_program(prompt: str, code: str, entry_point: str) -> str:
    """The program to test: the prompt (its imports and helpers) followed by the model's code.

    A completion that defines `entry_point` replaces the prompt's stub; otherwise it is taken as
    the body of the prompt's function (indented by four spaces when it is not indented at all)."""
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        return f"{prompt}\n\n{code}\n"
    lines = [line for line in code.splitlines() if line.strip()]
    if lines and not lines[0][0].isspace():
        code = textwrap.indent(code, "    ")
    return f"{prompt}{code}\n"


def split_check(test_source: str) -> list[tuple[str, str]]:
    """`check`'s body as [(kind, source)], kind "case" (counts) or "setup" (runs, does not count)."""
    module = ast.parse(test_source)
    check = next((node for node in module.body if isinstance(node, ast.FunctionDef) and node.name == "check"), None)
    if check is None:
        raise ValueError("the row's test code defines no check(candidate) function")
    if len(check.args.args) != 1:
        raise ValueError("check() must take exactly one argument (the candidate function)")
    param = check.args.args[0].arg
    steps = []
    for stmt in check.body:
        asserts = [n for n in ast.walk(stmt) if isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant)]
        source = ast.unparse(stmt)
        if param != "candidate":
            source = f"{param} = candidate\n{source}"
        steps.append(("case" if asserts else "setup", source))
    if not any(kind == "case" for kind, _ in steps):
        raise ValueError("check() contains no assert to grade")
    return steps


_HARNESS = r'''
import os as _os, signal as _signal, sys as _sys
_TOKEN, _PROGRAM, _TESTS, _ENTRY, _STEPS, _FIRST, _LIMIT = {payload}
_OUT = _os.dup(1)

class _CaseTimeout(BaseException):
    pass

def _alarm(*_):
    raise _CaseTimeout()

def _run(source, namespace):
    _signal.signal(_signal.SIGALRM, _alarm)
    _signal.setitimer(_signal.ITIMER_REAL, _LIMIT)
    try:
        exec(compile(source, "<tests>", "exec"), namespace)
        return True
    except BaseException:
        return False
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)

_namespace = {{"__name__": "candidate", "__builtins__": __builtins__}}
if _run(_PROGRAM, _namespace) and _run(_TESTS, _namespace) and callable(_namespace.get(_ENTRY)):
    _namespace["candidate"] = _namespace[_ENTRY]
    _os.write(_OUT, f"\n{{_TOKEN}} ready\n".encode())
    _case = -1
    for _kind, _source in _STEPS:
        if _kind == "case":
            _case += 1
            if _case < _FIRST:
                continue
        _passed = _run(_source, _namespace)
        if _kind == "case":
            _os.write(_OUT, f"\n{{_TOKEN}} {{_case}} {{int(_passed)}}\n".encode())
'''


def run_tests(program: str, test_source: str, entry_point: str, partial_credit: bool = True,
              timeout_s: float = 6.0, test_timeout_s: float = 2.0, max_restarts: int = 2,
              **sandbox_limits) -> dict:
    """Run the test cases against `program` in the sandbox: {"passed", "total", "results", "status"}."""
    steps = split_check(test_source) if partial_credit else [("case", "check(candidate)")]
    total = sum(kind == "case" for kind, _ in steps)
    results: dict[int, bool] = {}
    token = secrets.token_hex(16)
    first, budget, status = 0, timeout_s, "ok"
    for _ in range(max_restarts + 1):
        payload = repr((token, program, test_source, entry_point, steps, first, test_timeout_s))
        outcome = run_python(_HARNESS.format(payload=payload), timeout_s=budget, **sandbox_limits)
        ready = False
        for line in outcome.stdout.splitlines():
            parts = line.split()
            if parts[:2] == [token, "ready"]:
                ready = True
            elif len(parts) == 3 and parts[0] == token and parts[1].isdigit():
                results.setdefault(int(parts[1]), parts[2] == "1")
        budget -= outcome.wall_s
        status = outcome.status if outcome.status != "ok" else status
        missing = [i for i in range(first, total) if i not in results]
        if not missing or not ready or outcome.status == "timeout" or budget < 0.5:
            break
        first = missing[0] + 1  # the case it died in fails; go on with the next one
        if first >= total:
            break
    passed = sum(results.get(i, False) for i in range(total))
    return {"passed": passed, "total": total, "results": [results.get(i, False) for i in range(total)],
            "status": status}


@REWARD_FNS.register("code_tests", "fraction of the row's unit tests the extracted code passes, run in the sandbox")
def code_tests_reward(sample: Sample, partial_credit: bool = True, timeout_s: float = 6.0, test_timeout_s: float = 2.0,
                      memory_mb: int = 512, max_restarts: int = 2, **_) -> float:
    """Passed / total test cases (or all-or-nothing with `partial_credit=False`); details in info["code_tests"]."""
    row = sample.info["row"]
    missing = [k for k in ("test", "entry_point") if not row.get(k)]
    if missing:
        raise ValueError(f"code_tests needs rows with {missing} (e.g. task humaneval)")
    code = extract_code(sample.info["text"], row["entry_point"])
    program = build_program(row.get("prompt", ""), code, row["entry_point"])
    report = run_tests(program, row["test"], row["entry_point"], partial_credit, timeout_s, test_timeout_s,
                       max_restarts, memory_mb=memory_mb)
    sample.info["code_tests"] = {k: report[k] for k in ("passed", "total", "status")}
    return report["passed"] / report["total"]
