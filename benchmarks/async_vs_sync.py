"""The synchronous loop against the asynchronous one (max_staleness 1 and 2) on the quickstart, side by side.

    python benchmarks/async_vs_sync.py [--steps 14] [--eval-every 7] [--out docs/async_result.md]

Each mode trains the quickstart recipe (SmolLM2-135M-Instruct, GRPO, 8 prompts × 8 samples) in its
own child process, one after the other, on the same machine: `sync` with trainer.threads=2 (both
cores for each phase in turn), `async1`/`async2` with trainer.threads=1 (one core for the rollout
thread, one for the learner, in one process), `async1_ray`/`async2_ray` with the rollouts in a Ray
actor process (one core) and the learner in another (one core). Reported: samples/s and step time over the training wall clock
(evaluations excluded; the first step, with its warm-up, too), the staleness seen, and the held-out
greedy accuracy at each evaluation with the training minutes spent to reach it. The phase timings go
to --json for `benchmarks/async_projection.py`. Opt-in modes `async1_stream4` (the learner trains each
of 4 chunks as it arrives) and `async1_stream4_newest` (and each chunk takes the newest admitted
version) measure streaming consumption (`--modes sync,async1,async1_stream4,async1_stream4_newest`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import cpu_model, load_average

RAY_WORKER = ["dist.backend=ray", "dist.rollout_workers=1", "dist.worker_threads=1"]
MODES = {"sync": ["trainer.threads=2"],
         "async1": ["trainer.threads=1", "rollout.max_staleness=1"],
         "async2": ["trainer.threads=1", "rollout.max_staleness=2"],
         "async1_ray": ["trainer.threads=1", "rollout.max_staleness=1", *RAY_WORKER],
         "async2_ray": ["trainer.threads=1", "rollout.max_staleness=2", *RAY_WORKER],
         # streaming consumption (4 chunks) and multi-version batches: opt-in modes (--modes)
         "async1_stream4": ["trainer.threads=1", "rollout.max_staleness=1", "rollout.stream_chunks=4"],
         "async1_stream4_newest": ["trainer.threads=1", "rollout.max_staleness=1", "rollout.stream_chunks=4",
                                   "rollout.versions=newest"]}


def child(mode: str, steps: int, eval_every: int, num_eval: int, workdir: Path) -> dict:
    from lmrl.loading import load_config
    from lmrl.loops import train

    cfg = load_config("quickstart", [*MODES[mode], f"trainer.steps={steps}", f"eval.every={eval_every}",
                                     f"task.num_eval={num_eval}",
                                     f"run.output_dir={workdir}", f"run.name={mode}", "run.progress=false",
                                     "run.checkpoint_every=0"])
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "timing/step_s" in r]
    wall, curve = 0.0, [(0.0, result.eval_before.get("eval/accuracy"))]
    for r in rows:
        wall += r.get("timing/step_s", 0.0)
        if "eval/accuracy" in r and r["step"] > 0:
            curve.append((wall / 60, r["eval/accuracy"]))
    timed = steps_rows[1:]
    samples = 64 * len(timed)
    return {"mode": mode, "samples_per_s": samples / sum(r["timing/step_s"] for r in timed),
            "step_s": statistics.mean(r["timing/step_s"] for r in timed),
            "rollout_s": statistics.mean(r["timing/rollout_s"] for r in timed),
            "train_s": statistics.mean(r["timing/train_s"] for r in timed),
            "staleness": statistics.mean(r.get("async/staleness", 0.0) for r in timed),
            "rollout_times": [r["timing/rollout_s"] for r in timed], "curve": curve}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--eval-every", type=int, default=7)
    ap.add_argument("--num-eval", type=int, default=100, help="held-out problems per evaluation")
    ap.add_argument("--modes", default="sync,async1,async2,async1_ray,async2_ray")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", type=Path, help="phase timings for benchmarks/async_projection.py")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.steps, a.eval_every, a.num_eval, a.workdir)), flush=True)
        return
    results, loads = [], [load_average()]
    with tempfile.TemporaryDirectory(prefix="lmrl-async-") as tmp:
        for mode in a.modes.split(","):
            print(f"training {mode}…", file=sys.stderr, flush=True)
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(a.steps), "--eval-every",
                                  str(a.eval_every), "--num-eval", str(a.num_eval), "--workdir", tmp],
                                 check=True, capture_output=True, text=True)
            results.append(json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]))
            loads.append(load_average())
    base = results[0]
    lines = [f"Quickstart, {a.steps} steps per mode, evaluation every {a.eval_every} on {a.num_eval} held-out "
             f"problems; CPU: {cpu_model()}; "
             f"load average before/after each mode: {' → '.join(loads)}.", "",
             "| mode | samples/s | vs sync | step s | rollout s | update s | staleness | held-out accuracy (training minutes) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        curve = ", ".join(f"{acc:.2f} ({minutes:.1f})" for minutes, acc in r["curve"] if acc is not None)
        lines.append(f"| {r['mode']} | {r['samples_per_s']:.2f} | {r['samples_per_s'] / base['samples_per_s']:.2f}× | "
                     f"{r['step_s']:.1f} | {r['rollout_s']:.1f} | {r['train_s']:.1f} | {r['staleness']:.1f} | {curve} |")
    print("\n".join(lines))
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
