"""`code_tests`: the fraction of a task's unit tests that the model's code passes, run in the sandbox.

A row carries `test` (Python source defining `check(candidate)`, HumanEval style), `entry_point`
(the function under test) and optionally `prompt` (the code the model was asked to complete).

Where the verdict is formed. RL optimises against this grader, so the model's code is treated as
hostile and never sees, runs next to or reports the verdict. Two processes take part:
- the sandbox (a `SandboxSession`, driven by `lmrl.rewards.code_candidate`) runs the prompt plus
  the model's code and answers *calls*: "call #k (nonce n) with these arguments" -> "call #k
  (nonce n) returned this value" (or raised a builtin exception of this name, or failed).
  Arguments and values cross as tagged JSON of builtins only: exact types int, float, bool, str,
  bytes, None, list, tuple, dict, set, frozenset, recursively (`type(x) is int`, so a subclass
  with its own `__eq__` is refused).
  Anything else (an object pretending to be a list, a generator, numpy scalars) fails the call.
- the parent (this module, trusted) runs the row's `check` itself, with `candidate` (and the
  entry point's name) bound to a stub that sends each call to the sandbox and returns the decoded
  value. Every assertion, helper (`poly`, `encode_cyclic`… from the prompt, run here from the row,
  not from the model's module), `abs`, `math.isclose`, `sorted`… runs here on plain data. The test
  source and its expected values are never sent to the sandbox.
Whatever the sandboxed code does (introspect the harness with frames or `gc`, patch builtins or
`json`, print fake records, forge answers on the channel), the most it can achieve is to claim a
return value for the call it is asked: a response counts only if it names that call's id and the
random nonce that exists only in that request, and the claimed value is then compared by trusted
code with the trusted expected value. Forging a passing value means producing the right answer.

Partial credit: `check`'s body is split with `ast` into its top-level statements. Each statement
that contains an `assert` that can fail (its condition is not a true constant; `assert False` in a
`try`/`else` counts) is one test case (a `for` loop of asserts is one case); the other statements
(imports, helper variables, `assert True` notes) are set-up and run in order between the cases,
in one shared namespace, exactly as `check` would run them; a set-up statement that fails fails
every later case. A case passes when it runs to the end without an exception. With
`partial_credit: false` the reward is 1 when `check(candidate)` runs through as a whole, else 0
(HumanEval's own grading), decided the same way in the parent.

Failures: a call that times out (`test_timeout_s` of sandbox time per case), crashes or exits the
process (`sys.exit`, `os._exit`), returns something that is not plain data, or answers garbage
raises `CandidateFailed`, a BaseException the test's own `except Exception` cannot swallow, so the
case fails. An exception the candidate raises comes back as the builtin exception of that name
(what `check` would have seen); others, and `StopIteration` (it would end an `all(map(...))` early,
as a pass), as `CandidateFailed`. An answer deeper than 100 levels, longer than 8 MB or holding
many distinct values of one hash (hash flooding, quadratic in a set) fails too. A process that
dies or stops answering is replaced for the next call (at most `max_restarts` times, within the
overall `timeout_s`); a candidate that does not load (syntax error, no `entry_point`, exit at
import) fails every case. A candidate that fails, hangs or crashes earns 0 for the cases it
affected: that is a verdict, not an error, so the sample is never excluded for it. A missing
`test`/`entry_point`, a prompt or test that is not valid Python, or a test that passes the
candidate something other than plain data raises (the scorer then excludes the sample, a
configuration problem). The test's code runs in the trainer's process with `print` silenced and a
private `random` (fresh inputs, the trainer's global random state untouched). The threat model,
what is and is not guaranteed: docs/rewards/code_tests.md.
"""
from __future__ import annotations

import ast
import builtins
import re
import textwrap
import types

from lmrl.rewards.code_candidate import BadTest, CandidateFailed, RemoteCandidate
from lmrl.rewards.functions import REWARD_FNS
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
        asserts = [n for n in ast.walk(stmt)
                   if isinstance(n, ast.Assert) and not (isinstance(n.test, ast.Constant) and n.test.value)]
        source = ast.unparse(stmt)
        if param != "candidate":
            source = f"{param} = candidate\n{source}"
        steps.append(("case" if asserts else "setup", source))
    if not any(kind == "case" for kind, _ in steps):
        raise ValueError("check() contains no assert to grade")
    return steps


def _private_random() -> types.ModuleType:
    """`random` for the test's own code: the module's functions bound to a fresh generator, so the
    test draws fresh inputs (as in HumanEval) without touching the trainer's global random state."""
    import random

    module = types.ModuleType("random")
    module.__dict__.update(vars(random))
    rng = random.Random()
    for name, value in vars(random).items():
        if getattr(value, "__self__", None) is random._inst:
            setattr(module, name, getattr(rng, name))
    return module


def _trusted_namespace(prompt: str, test_source: str, entry_point: str, candidate) -> dict:
    """The row's prompt (helpers such as `poly`) and test run here, with the candidate a remote stub."""
    private: list = []

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "random" and level == 0:
            if not private:
                private.append(_private_random())
            return private[0]
        return builtins.__import__(name, globals, locals, fromlist, level)

    env = dict(vars(builtins), __import__=import_, print=lambda *a, **k: None)
    namespace = {"__name__": "lmrl_code_tests", "__builtins__": env}
    if prompt.strip():
        try:
            code = compile(prompt, "<prompt>", "exec")
        except SyntaxError:  # a prompt that ends inside a function body (the model writes the rest)
            try:
                code = compile(prompt.rstrip() + "\n    pass\n", "<prompt>", "exec")
            except SyntaxError as err:
                raise ValueError(f"code_tests: the row's prompt is not valid Python ({err})") from None
        exec(code, namespace)
    exec(compile(test_source, "<test>", "exec"), namespace)
    namespace[entry_point] = namespace["candidate"] = candidate
    return namespace


def _passes(code, namespace: dict) -> bool:
    try:
        exec(code, namespace)
        return True
    except BadTest:
        raise
    except (Exception, CandidateFailed):
        return False


def run_tests(program: str, test_source: str, entry_point: str, partial_credit: bool = True,
              timeout_s: float = 6.0, test_timeout_s: float = 2.0, max_restarts: int = 2, prompt: str = "",
              **sandbox_limits) -> dict:
    """Grade `program` against the row's `check`: {"passed", "total", "results", "status", "calls"}.

    The test runs here (with `prompt`, the row's own code, for its helpers); the program runs in the
    sandbox and only answers calls; `sandbox_limits` go to the sandbox (`memory_mb`, `packages`,
    `isolation`…): its filesystem holds the interpreter and the declared packages, never the tests."""
    steps = split_check(test_source) if partial_credit else [("case", "check(candidate)")]
    compiled = [(kind, compile(source, "<check>", "exec")) for kind, source in steps]
    total = sum(kind == "case" for kind, _ in steps)
    remote = RemoteCandidate(program, entry_point, timeout_s, test_timeout_s, max_restarts, sandbox_limits)
    name = entry_point if entry_point.isidentifier() else "candidate"

    def candidate(*args, **kwargs):
        return remote(*args, **kwargs)

    candidate.__name__ = candidate.__qualname__ = name
    namespace = _trusted_namespace(prompt, test_source, entry_point, candidate)
    results: list[bool] = []
    try:
        loaded = remote.start()
        broken = not loaded
        for kind, code in compiled:
            if broken:
                results += [False] if kind == "case" else []
                continue
            remote.begin_case()
            ok = _passes(code, namespace)
            if kind == "case":
                results.append(ok)
            elif not ok:
                broken = True  # the state later cases rely on is not there
    except BadTest as err:
        raise ValueError(f"code_tests: {err}") from None
    finally:
        remote.close()
    return {"passed": sum(results), "total": total, "results": results, "status": remote.status,
            "calls": remote.calls}


@REWARD_FNS.register("code_tests", "fraction of the row's unit tests the extracted code passes, run in the sandbox")
def code_tests_reward(sample: Sample, partial_credit: bool = True, timeout_s: float = 6.0, test_timeout_s: float = 2.0,
                      memory_mb: int = 512, max_restarts: int = 2, packages: list[str] | None = None, **_) -> float:
    """Passed / total test cases (or all-or-nothing with `partial_credit=False`); details in info["code_tests"].
    `packages`: top-level packages the candidate may import besides the standard library."""
    row = sample.row
    missing = [k for k in ("test", "entry_point") if not row.get(k)]
    if missing:
        raise ValueError(f"code_tests needs rows with {missing} (e.g. task humaneval)")
    code = extract_code(sample.text, row["entry_point"])
    program = build_program(row.get("prompt", ""), code, row["entry_point"])
    report = run_tests(program, row["test"], row["entry_point"], partial_credit, timeout_s, test_timeout_s,
                       max_restarts, prompt=row.get("prompt", ""), packages=tuple(packages or ()),
                       memory_mb=memory_mb)
    sample.info["code_tests"] = {k: report[k] for k in ("passed", "total", "status")}
    return report["passed"] / report["total"]
