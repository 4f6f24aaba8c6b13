"""The quickstart's step time on a busy machine: fixed threads (one per core) against `trainer.threads=auto`.

    python benchmarks/busy_machine.py --out docs/busy_machine_result.md

Each (policy, machine) pair trains the quickstart workload for `--steps` steps in a fresh process
(evaluation off) and reports the median step time, rollout tokens/s and the thread count used, read
from the run's metrics.jsonl. "busy" starts one competing process that spins on one core (a
pure-Python loop at normal priority, like a build or a browser tab) for the whole run; "idle" has
none. The pairs run one after another in one invocation, alternating policies, and `--repeats`
repeats the whole set; the ratios auto / fixed are taken within a machine state.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SPIN = "while True:\n    pass\n"


def run_quickstart(threads: str, busy: bool, steps: int, prompts: int, workdir: Path, name: str) -> dict:
    competitor = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    try:
        subprocess.run([sys.executable, "-m", "lmrl.cli", "train", "quickstart", f"trainer.steps={steps}",
                        f"trainer.threads={threads}", f"rollout.prompts_per_step={prompts}", "eval.at_start=false",
                        "eval.at_end=false", f"run.output_dir={workdir}", f"run.name={name}", "run.progress=false",
                        "run.checkpoint_every=0", "run.keep_checkpoints=1"], check=True, capture_output=True, env=env)
    finally:
        if competitor:
            competitor.kill()
            competitor.wait()
    rows = [json.loads(line) for line in (workdir / name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/step_s" in r][1:]  # the first step warms up
    return {"step_s": statistics.median(r["timing/step_s"] for r in rows),
            "rollout_tok_s": statistics.median(r["tokens_per_s"] for r in rows),
            "train_s": statistics.median(r["timing/train_s"] for r in rows),
            "threads": sorted({r.get("timing/threads") for r in rows})}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3, help="steps per run (the first is not timed)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (8 samples each, 40 tokens)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--fixed", default=str(os.cpu_count()), help="the fixed thread count compared (default: cores)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for machine in ("idle", "busy"):
                policies = (a.fixed, "auto") if r % 2 == 0 else ("auto", a.fixed)
                for policy in policies:
                    out = run_quickstart(policy, machine == "busy", a.steps, a.prompts, Path(tmp), f"{machine}-{policy}-{r}")
                    results.setdefault((machine, policy), []).append(out)
                    print(machine, policy, out, flush=True)
    lines = [f"# Step time on a busy machine ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)", "",
             f"`python benchmarks/busy_machine.py --steps {a.steps} --prompts {a.prompts} --repeats {a.repeats}`: "
             f"quickstart workload ({a.prompts} prompts × 8 samples, 40 tokens), median over steps 2–{a.steps} "
             "and repeats.", "",
             "| machine | threads setting | threads used | step (s) | rollout tokens/s | update (s) | step vs fixed |",
             "|---|---|---|---:|---:|---:|---:|"]
    for machine in ("idle", "busy"):
        base = statistics.median(o["step_s"] for o in results[(machine, a.fixed)])
        for policy in (a.fixed, "auto"):
            runs = results[(machine, policy)]
            step = statistics.median(o["step_s"] for o in runs)
            used = sorted({t for o in runs for t in o["threads"]})
            lines.append(f"| {machine} | {policy} | {', '.join(str(int(t)) for t in used)} | {step:.1f} | "
                         f"{statistics.median(o['rollout_tok_s'] for o in runs):.1f} | "
                         f"{statistics.median(o['train_s'] for o in runs):.1f} | {step / base:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
