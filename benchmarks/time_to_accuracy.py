"""Time-to-accuracy on the quickstart task: lmrl and TRL train the same GRPO run, then both are graded.

    python benchmarks/time_to_accuracy.py --out docs/time_to_accuracy_result.md

Training runs through `vs_trl.py` (separate processes, alternating step by step, same prompts, same
reward code) with the quickstart workload (8 prompts × 8 samples, 40 new tokens, lr 3e-5, 7 steps).
Each side's final weights are saved and graded by `lmrl eval quickstart` (greedy, the 100 held-out
problems, the quickstart's `answer` reward), as is the untrained model. The table gives the training
time each side needed (sum of its step times) and the accuracy it reached. Then lmrl alone trains
`--lmrl-steps` steps (default twice as many) with an evaluation every `--steps` steps, giving the
accuracy it reaches on a longer run and the training time it needed to get there.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def held_out_accuracy(model: str) -> float:
    """Greedy accuracy of `model` on the quickstart's held-out problems, via the lmrl CLI."""
    out = subprocess.run([sys.executable, "-m", "lmrl.cli", "eval", "quickstart", "--model", model],
                         check=True, capture_output=True, text=True).stdout
    found = re.search(r"eval/accuracy:\s*([0-9.]+)", out)
    if not found:
        raise RuntimeError(f"no accuracy in the output of lmrl eval:\n{out}")
    return float(found.group(1))


def lmrl_curve(steps: int, every: int, workdir: Path) -> list[tuple[int, float, float]]:
    """(step, cumulative training seconds, held-out accuracy) at each in-run evaluation of a longer run."""
    subprocess.run([sys.executable, "-m", "lmrl.cli", "train", "quickstart", f"trainer.steps={steps}",
                    f"eval.every={every}", "eval.at_start=false", f"run.output_dir={workdir}", "run.name=long",
                    "run.progress=false", "run.checkpoint_every=0"], check=True, capture_output=True)
    rows = [json.loads(line) for line in (workdir / "long" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    elapsed, curve = 0.0, []
    for r in rows:
        elapsed += r.get("timing/step_s", 0.0)
        if "eval/accuracy" in r:
            curve.append((r["step"], elapsed, r["eval/accuracy"]))
    return curve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--lmrl-steps", type=int, help="steps of lmrl's longer run (default: 2 × --steps)")
    p.add_argument("--out", type=Path, help="also write the markdown table here")
    a = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="lmrl-tta-") as tmp:   # trained models are ~1.6 GB each
        work = Path(tmp)
        raw = work / "vs_trl.json"
        subprocess.run([sys.executable, str(HERE / "vs_trl.py"), "--steps", str(a.steps), "--warmup", "0",
                        "--prompts", str(a.prompts), "--group", str(a.group), "--max-new-tokens", str(a.max_new_tokens),
                        "--lr", str(a.lr), "--save-models", str(work), "--json", str(raw)], check=True)
        rounds = json.loads(raw.read_text())["rounds"][0]
        train_s = {name: sum(s["step_s"] for s in rounds[name]["steps"]) for name in ("lmrl", "trl")}
        inert = [s["inert_rows"] for s in rounds["lmrl"]["done"]["steps"] if s.get("inert_rows") is not None]
        print("grading the untrained model and both trained models on the held-out problems…", flush=True)
        accuracy = {"base": held_out_accuracy("default"), "lmrl": held_out_accuracy(str(work / "lmrl")),
                    "trl": held_out_accuracy(str(work / "trl"))}
        curve = lmrl_curve(a.lmrl_steps or 2 * a.steps, a.steps, work)
    lines = [
        f"Quickstart task, GRPO, {a.prompts} prompts × {a.group} samples, {a.max_new_tokens} new tokens, "
        f"lr {a.lr}, {a.steps} steps; held-out greedy accuracy on the quickstart's 100 eval problems.",
        "",
        "| | training time (s) | held-out accuracy |",
        "|---|---:|---:|",
        f"| untrained | 0 | {accuracy['base']:.2f} |",
        f"| lmrl | {train_s['lmrl']:.0f} | {accuracy['lmrl']:.2f} |",
        f"| TRL | {train_s['trl']:.0f} | {accuracy['trl']:.2f} |",
        *[f"| lmrl, longer run, step {step} | {seconds:.0f} | {acc:.2f} |" for step, seconds, acc in curve],
        "",
        f"lmrl / TRL training time: {train_s['lmrl'] / train_s['trl']:.2f}. Rows lmrl's learner skipped as inert "
        f"(equal rewards in their group, zero gradient): {sum(inert) / max(len(inert), 1):.0%} on average.",
    ]
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out:
        a.out.write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
