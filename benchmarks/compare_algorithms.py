"""Train each preset for the same budget on the quickstart task, several seeds, and compare.

    python benchmarks/compare_algorithms.py --presets grpo dr_grpo dapo gspo --seeds 0 1 --steps 7
    python benchmarks/compare_algorithms.py --out docs/algorithms.md     # all presets, table + plot

Every run is the quickstart recipe with `algo.preset=<name>` and `trainer.seed=<seed>` (the same
prompts per seed across presets), evaluated greedily on the 100 held-out problems before and after.
Reported per preset (mean ± spread over seeds): held-out accuracy after training, its gain over the
untrained model, mean completion length and rollout entropy (mean −log p of the sampled tokens)
over the run, and training wall time. The markdown table and a PNG plot (accuracy, length,
entropy per step) go to `--out` and beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path


def run_one(preset: str, seed: int, steps: int, workdir: Path, extra: list[str]) -> dict:
    """Train one preset with one seed; returns its evaluation and per-step curves."""
    from lmrl.config import load_config
    from lmrl.loops.sync import train

    cfg = load_config("quickstart", [f"algo.preset={preset}", f"trainer.seed={seed}", f"trainer.steps={steps}",
                                     f"run.output_dir={workdir}", f"run.name={preset}-seed{seed}",
                                     "run.progress=false", *extra])
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_rows = [r for r in rows if "timing/step_s" in r]
    return {
        "preset": preset, "seed": seed, "train_s": result.train_seconds,
        "acc_before": result.eval_before.get("eval/accuracy", float("nan")),
        "acc_after": result.eval_after.get("eval/accuracy", float("nan")),
        "length": [r.get("response_length/mean", float("nan")) for r in steps_rows],
        "entropy": [r.get("entropy/rollout", float("nan")) for r in steps_rows],
        "train_acc": [r.get("accuracy", float("nan")) for r in steps_rows],
    }


def _mean_spread(values: list[float]) -> str:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def table(results: list[dict]) -> str:
    lines = ["| preset | seeds | held-out acc. after | gain | mean length | mean entropy | train time (s) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for preset in dict.fromkeys(r["preset"] for r in results):
        rs = [r for r in results if r["preset"] == preset]
        lines.append(" | ".join([
            f"| {preset}", str(len(rs)), _mean_spread([r["acc_after"] for r in rs]),
            _mean_spread([r["acc_after"] - r["acc_before"] for r in rs]),
            _mean_spread([statistics.mean(r["length"]) for r in rs]),
            _mean_spread([statistics.mean(r["entropy"]) for r in rs]),
            _mean_spread([r["train_s"] for r in rs])]) + " |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for preset in dict.fromkeys(r["preset"] for r in results):
        rs = [r for r in results if r["preset"] == preset]
        for ax, key in zip(axes, ("train_acc", "length", "entropy")):
            curve = [statistics.mean(vals) for vals in zip(*(r[key] for r in rs))]
            ax.plot(range(1, len(curve) + 1), curve, label=preset)
    for ax, title in zip(axes, ("training accuracy", "mean completion length", "entropy")):
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    from lmrl.config import PRESETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="*", default=sorted(PRESETS))
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1])
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="extra config override")
    p.add_argument("--out", type=Path, help="write the table here (and the plot beside it as a .png)")
    a = p.parse_args(argv)
    unknown = [name for name in a.presets if name not in PRESETS]
    if unknown:
        p.error(f"unknown presets {unknown}; known: {', '.join(sorted(PRESETS))}")
    workdir = Path(tempfile.mkdtemp(prefix="lmrl-compare-"))
    results = []
    for preset in a.presets:
        for seed in a.seeds:
            print(f"training {preset} seed {seed}…", flush=True)
            results.append(run_one(preset, seed, a.steps, workdir, a.override))
    md = table(results)
    print(md)
    if a.out:
        png = a.out.with_suffix(".png")
        plot(results, png)
        a.out.write_text(f"Quickstart task, {a.steps} steps, seeds {a.seeds}.\n\n{md}\n![curves]({png.name})\n")
        (a.out.with_suffix(".json")).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
