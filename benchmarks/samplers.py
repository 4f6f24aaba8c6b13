"""Samples and training time each prompt sampler needs to reach the uniform sampler's final held-out accuracy.

    python benchmarks/samplers.py --json benchmarks/results/samplers.json

Trains the quickstart workload (GRPO, 8 prompts × 8 samples, 40 new tokens, lr 3e-5) with `uniform`
(the quickstart recipe) and the `hive`, `heapa` and `curriculum` recipes (their sampler knobs), every
run in its own child process (`lmrl train`), all on the same `--num-train` training problems, with a
greedy evaluation on `--num-eval` held-out problems every `--eval-every` steps. Per run it reads the
curve (step, samples generated, training seconds so far, held-out accuracy) from metrics.jsonl; the
target is the uniform run's final accuracy with the same seed, and the table gives the first
evaluation at which each sampler reached it, with the samples and training seconds spent until then.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, load_average  # noqa: E402

SAMPLERS = {"uniform": "quickstart", "hive": "hive", "heapa": "heapa", "curriculum": "curriculum"}


def train_run(recipe: str, seed: int, a: argparse.Namespace, workdir: Path, name: str, at_start: bool) -> list[dict]:
    """Train `recipe` in a child process; its metrics rows."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    subprocess.run([sys.executable, "-m", "lmrl.cli", "train", recipe, f"trainer.steps={a.steps}",
                    f"trainer.seed={seed}", f"trainer.threads={a.threads}", f"task.num_train={a.num_train}",
                    f"task.num_eval={a.num_eval}", f"eval.every={a.eval_every}",
                    f"eval.at_start={str(at_start).lower()}", f"run.output_dir={workdir}", f"run.name={name}", "run.progress=false", "run.checkpoint_every=0",
                    "run.keep_checkpoints=1"], check=True, capture_output=True, env=env)
    return [json.loads(line) for line in (workdir / name / "metrics.jsonl").read_text().splitlines() if line.strip()]


def curve(rows: list[dict], samples_per_batch: int) -> list[tuple[int, int, float, float]]:
    """(step, samples generated, training seconds, held-out accuracy) at each evaluation."""
    samples, seconds, out = 0, 0.0, []
    for r in rows:
        samples += int(r.get("data/gen_batches", 0)) * samples_per_batch
        seconds += r.get("timing/step_s", 0.0)
        if "eval/accuracy" in r:
            out.append((r["step"], samples, seconds, r["eval/accuracy"]))
    return out


def reached(points: list[tuple[int, int, float, float]], target: float) -> tuple[int, int, float] | None:
    return next(((s, n, t) for s, n, t, acc in points if s > 0 and acc >= target), None)


def table(results: dict[str, dict[int, list]], seeds: list[int]) -> list[str]:
    lines = ["| sampler | seed | final accuracy | reached uniform's final at step | samples | training time (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, by_seed in results.items():
        for seed in seeds:
            points = by_seed[seed]
            target = results["uniform"][seed][-1][3]
            hit = reached(points, target)
            where = (f"{hit[0]} | {hit[1]} | {hit[2]:.0f}" if hit else "not reached | — | —")
            lines.append(f"| {name} | {seed} | {points[-1][3]:.2f} | {where} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=list(SAMPLERS))
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--num-train", type=int, default=64, help="training problems (few: prompts come round again)")
    p.add_argument("--num-eval", type=int, default=100, help="held-out problems graded at each evaluation")
    p.add_argument("--threads", default="1")
    p.add_argument("--json", type=Path, help="also write every curve here")
    a = p.parse_args(argv)
    samplers = ["uniform", *[s for s in a.samplers if s != "uniform"]]
    results: dict[str, dict[int, list]] = {s: {} for s in samplers}
    start, load_before = time.time(), load_average()
    with tempfile.TemporaryDirectory(prefix="lmrl-samplers-") as tmp:
        for seed in a.seeds:
            base = None
            for name in samplers:
                t0 = time.time()
                rows = train_run(SAMPLERS[name], seed, a, Path(tmp), f"{name}-{seed}", at_start=base is None)
                points = curve(rows, 8 * 8)
                base = base or points[0]
                results[name][seed] = [base, *points[1:]] if points[0][0] == 0 else [base, *points]
                print(f"{name} seed {seed}: {[(s, round(acc, 2)) for s, _, _, acc in results[name][seed]]} "
                      f"({time.time() - t0:.0f} s)", flush=True)
    lines = [f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average before {load_before}, after "
             f"{load_average()}; {(time.time() - start) / 60:.0f} min in all.",
             f"{a.steps} steps, {a.num_train} training problems, greedy accuracy on {a.num_eval} held-out problems "
             f"every {a.eval_every} steps, trainer.threads={a.threads}.", "", *table(results, a.seeds)]
    print("\n".join(lines))
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "curves": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
