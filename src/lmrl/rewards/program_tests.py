"""`program_tests`: the fraction of stdin/stdout tests that the model's C, C++ or JavaScript program passes.

A row carries `language` (`c`, `cpp`, `javascript`; aliases `c++`, `js`, `node`) and `tests`, a list (or
its JSON text) of `{"input": stdin text, "output": expected stdout}`. The program is the reply's last
fenced code block (an unclosed fence runs to the end; no fence: the whole reply).

Where the verdict is formed. RL optimises against this grader, so the program is hostile:
- C and C++ are compiled (`gcc`/`g++ -O1`, `-lm`) in a sandbox of their own whose root holds the
  toolchain read-only (driver, cc1, as, ld, headers, libc) and a fresh host directory for the
  binary, nothing else (`lmrl.rewards.sandbox_program`). JavaScript is run by `node` with its
  permission model on (no file reads but the program's own, no child processes, no workers).
- each test runs the program once in a fresh sandbox (`run_program`): the shared libraries and the
  binary (or node and the script), read-only; private tmpfs; no network; new pid/IPC/UTS namespaces;
  the user `nobody`; rlimits (CPU, address space, file size, open files, processes); the test's
  input on stdin. The expected outputs and the other tests' inputs are never in any sandbox, and a
  run's files vanish with it, so one run cannot pass anything to the next.
- the parent (this module, trusted) compares the captured stdout with the expected output:
  equal line by line after stripping trailing whitespace of each line and trailing blank lines;
  with `float_tolerance` t, lines also match when they have the same tokens except numbers a, b with
  |a - b| <= t * max(1, |b|).
Reward: passed / total (`partial_credit: true`, default), else 1 only when every test passes. A
compile error, a timeout, a crash, a non-zero exit status or output past `max_output_bytes` fails
the tests it affects: a verdict (info["program_tests"]), never an error. A row without a known
language or with malformed tests, or a missing compiler/runtime (named with its Debian package),
raises: the scorer excludes the sample, a configuration problem. Threat model:
docs/rewards/program_tests.md.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass

from lmrl.rewards.code import FENCE
from lmrl.rewards.functions import REWARD_FNS, row_list
from lmrl.rewards.sandbox_program import OUTPUT_DIR, run_program
from lmrl.types import Sample

NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
BINARY = "prog"
V8_RESERVE_MB = 1536  # address space node reserves beyond its heap (code range, cages) before running anything


@dataclass(frozen=True)
class Language:
    """How one language is built and run: argv inside the sandbox and the host paths each step needs."""

    source: str  # the file name the program is written to
    run_argv: tuple[str, ...]  # "{memory_mb}" is replaced by the heap limit
    run_tools: tuple[str, ...]
    compile_argv: tuple[str, ...] = ()  # empty: interpreted
    compile_tools: tuple[str, ...] = ()
    packages: tuple[tuple[str, str], ...] = ()  # (host path, Debian package providing it)
    max_processes: int = 4  # processes and threads of one run
    reserve_mb: int = 0  # address space added to memory_mb for the runtime itself


TOOLCHAIN = ("/usr/bin/as", "/usr/bin/ld", "/usr/include")
BINUTILS = (("/usr/bin/as", "binutils"), ("/usr/bin/ld", "binutils"), ("/usr/include/stdio.h", "libc6-dev"))
LANGUAGES = {
    "c": Language("main.c", (f"./{BINARY}",), (), ("/usr/bin/gcc", "-O1", "-std=gnu17", "-o", f"out/{BINARY}",
                                                  "main.c", "-lm"),
                  ("/usr/bin/gcc", *TOOLCHAIN), (("/usr/bin/gcc", "gcc"), *BINUTILS)),
    "cpp": Language("main.cpp", (f"./{BINARY}",), (), ("/usr/bin/g++", "-O1", "-std=gnu++17", "-o", f"out/{BINARY}",
                                                      "main.cpp", "-lm"),
                    ("/usr/bin/g++", *TOOLCHAIN), (("/usr/bin/g++", "g++"), *BINUTILS)),
    "javascript": Language("main.js", ("/usr/bin/node", "--experimental-permission", "--allow-fs-read=/sandbox/main.js",
                                       "--max-old-space-size={memory_mb}", "main.js"),
                           ("/usr/bin/node",), packages=(("/usr/bin/node", "nodejs"),), max_processes=32,
                           reserve_mb=V8_RESERVE_MB),
}
ALIASES = {"c++": "cpp", "cxx": "cpp", "js": "javascript", "node": "javascript"}


def language(name: object) -> tuple[str, Language]:
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in LANGUAGES:
        raise ValueError(f"program_tests: the row's language {name!r} is not one of {sorted(LANGUAGES)} "
                         f"(aliases {sorted(ALIASES)}); set the row's `language` field")
    missing = [f"{path} (apt-get install {package})" for path, package in LANGUAGES[key].packages
               if not os.path.exists(path)]
    if missing:
        raise RuntimeError(f"program_tests: {key} needs {', '.join(missing)}; scripts/setup.sh installs them as root")
    return key, LANGUAGES[key]


def extract_program(text: str) -> str:
    """The reply's last fenced code block (an unclosed fence runs to the end), else the whole reply."""
    blocks = FENCE.findall(text)
    return blocks[-1][1] if blocks else text


def read_tests(value: object) -> list[tuple[str, str]]:
    """[(stdin, expected stdout)] from the row's `tests` (a list, or its JSON text)."""
    value = row_list(value, "program_tests", "tests", '[{"input": ..., "output": ...}]')
    tests = []
    for i, test in enumerate(value):
        if not isinstance(test, dict) or not isinstance(test.get("input"), str) \
                or not isinstance(test.get("output"), str):
            raise ValueError(f'program_tests: test {i} must be {{"input": text, "output": text}}, not {test!r:.80}')
        tests.append((test["input"], test["output"]))
    return tests


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _tokens_match(got: str, expected: str, tolerance: float) -> bool:
    if got == expected:
        return True
    if not (NUMBER.fullmatch(got) and NUMBER.fullmatch(expected)):
        return False
    a, b = float(got), float(expected)
    return abs(a - b) <= tolerance * max(1.0, abs(b))


def outputs_match(got: str, expected: str, float_tolerance: float | None = None) -> bool:
    """The comparison rule (module docstring): trailing whitespace and blank lines aside, exact, or
    number tokens within `float_tolerance` (relative past magnitude 1)."""
    a, b = _lines(got), _lines(expected)
    if a == b:
        return True
    if float_tolerance is None or len(a) != len(b):
        return False
    for line_a, line_b in zip(a, b):
        tokens_a, tokens_b = line_a.split(), line_b.split()
        if len(tokens_a) != len(tokens_b) or not all(_tokens_match(x, y, float_tolerance)
                                                     for x, y in zip(tokens_a, tokens_b)):
            return False
    return True


def _verdict(result, expected: str, float_tolerance: float | None) -> str:
    if result.status == "timeout":
        return "timeout"
    if result.status == "killed" and result.reason == "output limit":
        return "output_limit"
    if result.status != "ok":
        return "runtime_error"
    return "passed" if outputs_match(result.stdout, expected, float_tolerance) else "wrong_answer"


def _compile(lang: Language, source_path: str, out_dir: str, timeout_s: float, memory_mb: int) -> tuple[str | None, str]:
    """(the binary's host path, or None, and why not) after compiling in a sandbox of its own."""
    result = run_program(list(lang.compile_argv), lang.compile_tools, files={source_path: lang.source},
                         output_dir=out_dir, timeout_s=timeout_s, memory_mb=memory_mb, file_size_mb=64,
                         max_processes=16)
    if result.status != "ok":
        return None, f"compile {result.status}: {result.reason}; {result.stderr[-500:]}".strip()
    binary = os.path.join(out_dir, BINARY)
    try:
        mode = os.lstat(binary).st_mode
    except FileNotFoundError:
        return None, "the compiler wrote no binary"
    if not stat.S_ISREG(mode):  # never bind anything but the file the compiler wrote
        return None, "the compiler's output is not a regular file"
    os.chmod(binary, 0o755)
    return binary, ""


def run_tests(program: str, language_name: str, tests: list[tuple[str, str]], float_tolerance: float | None = None,
              test_timeout_s: float = 2.0, compile_timeout_s: float = 20.0, memory_mb: int = 256,
              max_output_bytes: int = 256_000) -> dict:
    """Build `program` and run it on each test in a fresh sandbox: {"passed", "total", "verdicts", "status"}."""
    _, lang = language(language_name)
    work = tempfile.mkdtemp(prefix="lmrl-program-")
    try:
        source_path = os.path.join(work, lang.source)
        with open(source_path, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(program)
        os.chmod(source_path, 0o644)
        files = {source_path: lang.source}
        if lang.compile_argv:
            out_dir = os.path.join(work, os.path.basename(OUTPUT_DIR))
            os.mkdir(out_dir)
            binary, why = _compile(lang, source_path, out_dir, compile_timeout_s, max(memory_mb, 1024))
            if binary is None:
                return {"passed": 0, "total": len(tests), "verdicts": ["compile_error"] * len(tests),
                        "status": "compile_error", "detail": why[-300:]}
            files = {binary: BINARY}
        argv = [arg.replace("{memory_mb}", str(memory_mb)) for arg in lang.run_argv]
        verdicts = []
        for stdin, expected in tests:
            result = run_program(argv, lang.run_tools, stdin=stdin, files=files, timeout_s=test_timeout_s,
                                 memory_mb=memory_mb + lang.reserve_mb, max_processes=lang.max_processes,
                                 max_output_bytes=max_output_bytes)
            verdicts.append(_verdict(result, expected, float_tolerance))
        return {"passed": verdicts.count("passed"), "total": len(tests), "verdicts": verdicts,
                "status": "compiled" if lang.compile_argv else "interpreted"}
    finally:
        shutil.rmtree(work, ignore_errors=True)


@REWARD_FNS.register("program_tests", "fraction of the row's stdin/stdout tests a C, C++ or JavaScript program passes "
                                      "(compiled and run in the sandbox)")
def program_tests_reward(sample: Sample, partial_credit: bool = True, float_tolerance: float | None = None,
                         test_timeout_s: float = 2.0, compile_timeout_s: float = 20.0, memory_mb: int = 256,
                         max_output_bytes: int = 256_000, language: str | None = None, **_) -> float:
    """Passed / total tests (all-or-nothing with `partial_credit=False`); details in info["program_tests"].
    `language`: the language for every row (else the row's `language`)."""
    row = sample.row
    language = language or row.get("language")
    if not language or row.get("tests") is None:
        raise ValueError("program_tests needs rows with `tests` and a `language` (in the row or the reward's "
                         "params), e.g. recipe code_c")
    report = run_tests(extract_program(sample.text), language, read_tests(row["tests"]), float_tolerance,
                       test_timeout_s, compile_timeout_s, memory_mb, max_output_bytes)
    sample.info["program_tests"] = report
    if partial_credit:
        return report["passed"] / report["total"]
    return float(report["passed"] == report["total"])
