"""Train each preset for the same budget on the quickstart task, several seeds, and compare.

    python benchmarks/compare_algorithms.py --presets grpo dr_grpo dapo --seeds 0 1 --results r.json
    python benchmarks/compare_algorithms.py --report r.json --out docs/algorithms_table.md   # table + plot only

Every run is the quickstart recipe with `algo.preset=<name>` and `trainer.seed=<seed>` (the same
prompts per seed across presets), graded greedily on the 100 held-out problems after training. The
untrained model is graded once (greedy decoding does not depend on the seed or the preset) and
stored as the `baseline` entry. Results accumulate in `--results` (a JSON list, written after every
run): runs already there are skipped, so an interrupted comparison resumes, and several processes
(e.g. one per seed, `--threads 1` each) can fill separate files that `--report` merges.

Reported per preset (mean ± standard deviation over seeds): held-out accuracy after training, its
gain over the untrained model, mean completion length and rollout entropy (mean −log p of the
sampled tokens) over the run, the fraction of tokens the loss clipped or masked (where it reports
one), and training wall time. The markdown table and a PNG plot (training accuracy, length, entropy
per step) go to `--out` and beside it. Runs with `--override KEY=VALUE` are rows of their own, named
after their overrides (e.g. `trainer.mini_batches=4`: four optimiser steps per batch, so ratios
leave 1 and clipping can bind).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

PRESETS_OFF_TASK = {"gdpo", "rvpo", "xgrpo", "alpo", "prpo", "p_grpo", "prp"}  # need components or task fields


def _config(preset: str, seed: int, steps: int, workdir: Path, extra: list[str], at_start: bool):
    from lmrl.loading import load_config

    return load_config("quickstart", [f"algo.preset={preset}", f"trainer.seed={seed}", f"trainer.steps={steps}",
                                      f"run.output_dir={workdir}", f"run.name={preset}-seed{seed}",
                                      "run.progress=false", f"eval.at_start={str(at_start).lower()}", *extra])


def run_one(preset: str, seed: int, steps: int, workdir: Path, extra: list[str], baseline: bool) -> list[dict]:
    """Train one preset with one seed; returns its record (and the baseline's when `baseline`)."""
    from lmrl.loops import train

    result = train(_config(preset, seed, steps, workdir, extra, at_start=baseline))
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_rows = [r for r in rows if "timing/step_s" in r]
    record = {
        "preset": preset, "seed": seed, "steps": steps, "overrides": list(extra), "train_s": result.train_seconds,
        "acc_after": result.eval_after.get("eval/accuracy", float("nan")),
        "length": [r.get("response_length/mean", float("nan")) for r in steps_rows],
        "entropy": [r.get("entropy/rollout", float("nan")) for r in steps_rows],
        "train_acc": [r.get("accuracy", float("nan")) for r in steps_rows],
        "clip_frac": [r.get("clip_frac", float("nan")) for r in steps_rows],
    }
    out = [record]
    if baseline:
        out.append({"preset": "baseline", "seed": None, "acc": result.eval_before.get("eval/accuracy", float("nan"))})
    return out


def _mean_spread(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _finite_mean(values: list[float]) -> float:
    """Mean over the steps that reported a value (a step whose rows were all inert reports none)."""
    values = [v for v in values if math.isfinite(v)]
    return statistics.mean(values) if values else float("nan")


def _runs(results: list[dict]) -> list[dict]:
    return [r for r in results if r["preset"] != "baseline"]


def label(r: dict) -> str:
    """The row name of a run: its preset, plus the overrides it ran with (e.g. several optimiser steps per batch)."""
    return " + ".join([r["preset"], *r.get("overrides", [])])


def _key(r: dict) -> tuple:
    return r["preset"], r["seed"], r.get("steps"), tuple(r.get("overrides", []))


def baseline_accuracy(results: list[dict]) -> float:
    accs = [r["acc"] for r in results if r["preset"] == "baseline"]
    return accs[0] if accs else float("nan")


def identical_to(runs: list[dict]) -> dict[str, str]:
    """Presets whose every run repeats, number for number, the same-seed run of an earlier preset.

    On-policy with one optimiser step per batch, losses that differ only in how they treat a ratio
    away from 1 give exactly the same updates; the table says so instead of ranking them apart.
    """
    def trace(r: dict) -> tuple:
        return (r["seed"], r["acc_after"], tuple(r["length"]), tuple(r["entropy"]), tuple(r["train_acc"]))

    first: dict[tuple, str] = {}
    same: dict[str, set[str]] = {}
    for r in runs:
        owner = first.setdefault(trace(r), label(r))
        same.setdefault(label(r), set()).add(owner if owner != label(r) else "")
    return {p: next(iter(o)) for p, o in same.items() if len(o) == 1 and "" not in o}


def table(results: list[dict]) -> str:
    """One row per preset, sorted by mean held-out accuracy after training."""
    base = baseline_accuracy(results)
    runs = _runs(results)
    twins = identical_to(runs)
    def mean_accuracy(preset: str) -> float:
        accs = [r["acc_after"] for r in runs if label(r) == preset and math.isfinite(r["acc_after"])]
        return statistics.mean(accs) if accs else float("-inf")

    presets = sorted(dict.fromkeys(label(r) for r in runs), key=lambda p: -mean_accuracy(p))
    lines = ["| preset | seeds | held-out acc. after | gain | mean length | mean rollout entropy | clip fraction "
             "| train time (s) | note |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for preset in presets:
        rs = [r for r in runs if label(r) == preset]
        lines.append(" | ".join([
            f"| {preset}", str(len(rs)), _mean_spread([r["acc_after"] for r in rs], 2),
            _mean_spread([r["acc_after"] - base for r in rs], 2),
            _mean_spread([statistics.mean(r["length"]) for r in rs], 1),
            _mean_spread([statistics.mean(r["entropy"]) for r in rs], 2),
            _mean_spread([_finite_mean(r["clip_frac"]) for r in rs if "clip_frac" in r], 3),
            _mean_spread([r["train_s"] for r in rs], 0),
            f"same run as {twins[preset]}" if preset in twins else ""]) + " |")
    return f"Untrained model: held-out accuracy {base:.2f}.\n\n" + "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    """Held-out accuracy per preset (bars: mean, dots: seeds) and the per-step curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _runs(results)
    presets = sorted(dict.fromkeys(label(r) for r in runs))
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.6), gridspec_kw={"width_ratios": [1.1, 1, 1, 1]})
    by_acc = sorted(presets, key=lambda p: statistics.mean(r["acc_after"] for r in runs if label(r) == p))
    for y, preset in enumerate(by_acc):
        accs = [r["acc_after"] for r in runs if label(r) == preset]
        axes[0].barh(y, statistics.mean(accs), color="tab:blue", alpha=0.4)
        axes[0].plot(accs, [y] * len(accs), "o", color="tab:blue", markersize=3)
    axes[0].axvline(baseline_accuracy(results), color="grey", linestyle=":", label="untrained")
    axes[0].set_yticks(range(len(by_acc)), by_acc, fontsize=7)
    axes[0].set_title("held-out accuracy after training")
    axes[0].legend(fontsize=7)
    cmap = plt.get_cmap("tab20")
    for i, preset in enumerate(presets):
        rs = [r for r in runs if label(r) == preset]
        for ax, key in zip(axes[1:], ("train_acc", "length", "entropy")):
            curve = [statistics.mean(vals) for vals in zip(*(r[key] for r in rs))]
            ax.plot(range(1, len(curve) + 1), curve, label=preset, color=cmap(i % 20),
                    linestyle="-" if i < 12 else "--")
    for ax, title in zip(axes[1:], ("training accuracy (mean over seeds)", "mean completion length",
                                    "rollout entropy")):
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_results(paths: list[Path]) -> list[dict]:
    """The runs of every file, each (preset, seed, steps, overrides) once (the first file wins)."""
    merged: dict[tuple, dict] = {}
    for path in paths:
        if path.exists():
            for r in json.loads(path.read_text()):
                merged.setdefault(_key(r), r)
    return list(merged.values())


def write_report(results: list[dict], out: Path) -> str:
    md = table(results)
    png = out.with_suffix(".png")
    plot(results, png)
    steps = sorted({r["steps"] for r in _runs(results)})
    seeds = sorted({r["seed"] for r in _runs(results)})
    out.write_text(f"Quickstart task, {steps} steps, seeds {seeds}.\n\n{md}\n![curves]({png.name})\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    return md


def main(argv: list[str] | None = None) -> int:
    from lmrl.presets import PRESETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="*", default=sorted(set(PRESETS) - PRESETS_OFF_TASK))
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1])
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--threads", type=int, help="torch threads per run (default: torch's choice)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="extra config override")
    p.add_argument("--results", type=Path, help="JSON file the runs accumulate in (runs already there are skipped)")
    p.add_argument("--report", type=Path, nargs="*", help="only merge these result files into --out")
    p.add_argument("--out", type=Path, help="write the table here (and the plot beside it as a .png)")
    a = p.parse_args(argv)
    if a.report is not None:
        if not a.out:
            p.error("--report needs --out")
        print(write_report(load_results(a.report), a.out))
        return 0
    unknown = [name for name in a.presets if name not in PRESETS]
    if unknown:
        p.error(f"unknown presets {unknown}; known: {', '.join(sorted(PRESETS))}")
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    results = load_results([a.results]) if a.results else []
    done = {_key(r) for r in results}
    for preset in a.presets:
        for seed in a.seeds:
            if (preset, seed, a.steps, tuple(a.override)) in done:
                continue
            need_baseline = not any(r["preset"] == "baseline" for r in results)
            print(f"training {preset} seed {seed}…", flush=True)
            with tempfile.TemporaryDirectory(prefix="lmrl-compare-") as workdir:
                results += run_one(preset, seed, a.steps, Path(workdir), a.override, need_baseline)
            print(f"  held-out accuracy {results[-1 - need_baseline]['acc_after']:.2f}, "
                  f"{results[-1 - need_baseline]['train_s']:.0f} s", flush=True)
            if a.results:
                a.results.write_text(json.dumps(results, indent=1))
    print(table(results))
    if a.out:
        write_report(results, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
