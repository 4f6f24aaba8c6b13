"""A refactor changes no result: train real recipes before and after, then compare their metrics.jsonl.

    python benchmarks/same_metrics.py run --out /tmp/before [--recipes quickstart,gspo,...] [--steps 3]
    (change the code)
    python benchmarks/same_metrics.py run --out /tmp/after
    python benchmarks/same_metrics.py compare /tmp/before /tmp/after

`run` trains each recipe for `--steps` steps with the embedded SmolLM2 (a short evaluation on 16
held-out prompts at the start and end) in its own `lmrl train` process, using the Python that runs
this script and the lmrl its `sys.path` finds first (set PYTHONPATH to compare two checkouts).
`compare` prints, per recipe, whether every logged row is equal, leaving out what depends on the wall
clock (`time`, `timing/*`, `tokens_per_s`, the asynchronous loop's waits and sample ages) and rows
logged as `inputs/*` notes. It exits 1 when any recipe differs, naming the first differing key.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# recipe label -> (recipe, extra overrides); "async" is the quickstart in the asynchronous loop
RECIPES = {
    "quickstart": ("quickstart", []),
    "gspo": ("gspo", []),
    "ppo": ("ppo", []),
    "sgt": ("sgt", []),
    "async": ("quickstart", ["rollout.max_staleness=1", "trainer.threads=1"]),
    "dapo": ("dapo", []),
    "cost_aware_grpo": ("cost_aware_grpo", []),
}
WALL_CLOCK = ("time", "tokens_per_s", "async/wait_s", "async/stream_wait_s", "async/sample_age_s")


def wall_clock(key: str) -> bool:
    return key in WALL_CLOCK or key.startswith("timing/") or key.startswith("async/age")


def run(out: Path, recipes: list[str], steps: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for label in recipes:
        recipe, extra = RECIPES[label]
        overrides = [f"trainer.steps={steps}", "eval.num_prompts=16", "run.progress=false", "run.checkpoint_every=0",
                     f"run.output_dir={out}", f"run.name={label}", "run.overwrite=true", *extra]
        print(f"{label}: lmrl train {recipe} {' '.join(overrides)}", flush=True)
        done = subprocess.run([sys.executable, "-m", "lmrl.cli", "train", recipe, *overrides],
                              env=os.environ.copy(), capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:])
            raise SystemExit(f"{label} failed with exit {done.returncode}")


def rows(path: Path) -> list[dict]:
    kept = []
    for line in path.read_text().splitlines():
        row = {k: v for k, v in json.loads(line).items() if not wall_clock(k)}
        if any(k.startswith("inputs/") for k in row):
            continue
        kept.append(row)
    return kept


def compare(before: Path, after: Path) -> int:
    failed = 0
    for path in sorted(before.glob("*/metrics.jsonl")):
        label = path.parent.name
        other = after / label / "metrics.jsonl"
        if not other.exists():
            print(f"{label}: missing in {after}")
            failed += 1
            continue
        a, b = rows(path), rows(other)
        diff = next(((i, k) for i, (x, y) in enumerate(zip(a, b)) for k in sorted(x.keys() | y.keys())
                     if x.get(k) != y.get(k)), None)
        if len(a) != len(b) or diff is not None:
            failed += 1
            where = f"row {diff[0]} key {diff[1]}: {a[diff[0]].get(diff[1])!r} != {b[diff[0]].get(diff[1])!r}" \
                if diff else f"{len(a)} rows != {len(b)} rows"
            print(f"{label}: DIFFERENT ({where})")
        else:
            keys = len({k for r in a for k in r})
            print(f"{label}: identical ({len(a)} rows, {keys} metrics compared)")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--recipes", default=",".join(RECIPES))
    r.add_argument("--steps", type=int, default=3)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.out, args.recipes.split(","), args.steps)
    else:
        raise SystemExit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
