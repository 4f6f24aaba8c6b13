"""How significant the preset comparison of docs/algorithms.md is, from the per-seed results it already has.

    python benchmarks/algorithms_significance.py                       # reads docs/algorithms_table.json
    python benchmarks/algorithms_significance.py --out docs/algorithms_significance.md

Nothing is re-run. Each preset (with its overrides) is an arm of `lmrl compare`'s machinery
(`lmrl.eval.compare`) whose runs are its seeds, and GRPO is the reference:

1. over seeds (what the table can support): Welch's t per preset and metric against GRPO, Holm's
   correction over all of them; and a one-way ANOVA of held-out accuracy, which asks whether the
   presets' means spread more than their seed-to-seed differences predict;
2. over prompts only (what it would look like if grading 100 problems were the only noise): each
   arm's seeds pooled into 100 graded problems per seed and bootstrapped. The per-problem grades
   were not kept, so each run is rebuilt as its number of correct problems, unpaired; and each
   preset's two seeds against each other the same way, which shows how far apart one setting's
   runs land.
Presets with one seed (the runs identical to GRPO's seed 0) have no seed spread and are left out.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
METRICS = ("accuracy", "mean_length", "mean_entropy")  # the table's columns (its gain is accuracy − a constant)
CLAIMS = (  # what docs/algorithms.md said, the reference arm, the other arm, the metric
    ("EVPO above PPO", "ppo", "evpo", "accuracy"),
    ("Entrocraft below GRPO", "grpo", "entrocraft", "accuracy"),
    ("PIPO below GRPO", "grpo", "pipo", "accuracy"),
    ("RLOO below GRPO", "grpo", "rloo", "accuracy"),
    ("Dr.GRPO below GRPO", "grpo", "dr_grpo", "accuracy"),
    ("GEPO keeps the final entropy above GRPO's", "grpo", "gepo", "final_entropy"),
    ("GFT raises the final entropy", "grpo", "gft", "final_entropy"),
    ("Policy Split keeps the final entropy higher", "grpo", "policy_split", "final_entropy"),
    ("DAPO's final entropy below GRPO's", "grpo", "dapo", "final_entropy"),
    ("GSPO's entropy below GRPO's", "grpo", "gspo", "mean_entropy"),
    ("SAPO's entropy below GRPO's", "grpo", "sapo", "mean_entropy"),
    ("χ² keeps the final replies longer", "grpo", "grpo_chi2", "final_length"),
)
PROBLEMS = 100  # held-out problems each run was graded on


def label(r: dict) -> str:
    return " + ".join([r["preset"], *r.get("overrides", [])])


def seed_runs(results: list[dict]) -> dict[str, list]:
    """Preset label → its runs (one per seed) as `lmrl.eval.compare.Run`s with the table's metrics."""
    from lmrl.eval.compare import Run

    arms: dict[str, list] = {}
    for r in results:
        if r["preset"] == "baseline":
            continue
        steps = list(range(1, len(r["train_acc"]) + 1))
        metrics = {"accuracy": r["acc_after"], "mean_length": statistics.mean(r["length"]),
                   "mean_entropy": statistics.mean(r["entropy"]), "final_entropy": r["entropy"][-1],
                   "final_length": r["length"][-1]}
        curves = {"train_acc": (steps, r["train_acc"]), "length": (steps, r["length"]),
                  "entropy": (steps, r["entropy"])}
        arms.setdefault(label(r), []).append(Run(f"{label(r)} seed {r['seed']}", metrics, curves=curves))
    return arms


def graded(run, n: int = PROBLEMS) -> list[dict]:
    """A run's held-out grades rebuilt from its accuracy (which problems were right is not known)."""
    right = round(run.metrics["accuracy"] * n)
    return [{"uid": f"{run.name}/{i}", "correct": i < right} for i in range(n)]


def accuracy(records: list[dict]) -> dict[str, float]:
    """The one metric rebuilt grades give."""
    return {"accuracy": sum(r["correct"] for r in records) / len(records)}


def analyse(results: list[dict], alpha: float, n_boot: int) -> dict:
    """Every analysis of the module docstring, as plain numbers."""
    from lmrl.eval.compare import Arm, Run, Unit, compare
    from lmrl.eval.significance import apply_holm, bootstrap, oneway_anova, welch

    runs = seed_runs(results)
    seeded = {k: v for k, v in runs.items() if len(v) >= 2}
    order = ["grpo", *sorted((k for k in seeded if k != "grpo"),
                             key=lambda k: -statistics.mean(r.metrics["accuracy"] for r in seeded[k]))]
    over_seeds = compare([Arm(k, seeded[k]) for k in order], alpha, metrics=list(METRICS))
    claims = [welch(claim, [r.metrics[metric] for r in seeded[ref]], [r.metrics[metric] for r in seeded[other]],
                    alpha) for claim, ref, other, metric in CLAIMS]
    apply_holm(claims, alpha)
    anova = oneway_anova([[r.metrics["accuracy"] for r in seeded[k]] for k in order])
    plain = [k for k in order if "+" not in k]
    anova_plain = oneway_anova([[r.metrics["accuracy"] for r in seeded[k]] for k in plain])
    pooled = []
    for k in order:
        unit = Unit([g for r in seeded[k] for g in graded(r)], accuracy)
        pooled.append(Arm(k, [Run(k, unit.aggregate(unit.records), {"prompts": unit})]))
    over_prompts = compare(pooled, alpha, n_boot, metrics=["accuracy"])
    pairs = []
    for k in order:
        first, second = sorted(seeded[k], key=lambda r: r.name)[:2]
        test = bootstrap(graded(first), graded(second), accuracy, alpha, n_boot)[0][0]
        test.metric = k
        pairs.append(test)
    apply_holm(pairs, alpha)
    within = [statistics.variance([r.metrics["accuracy"] for r in seeded[k]]) for k in order]
    baseline = next((r["acc"] for r in results if r["preset"] == "baseline"), float("nan"))
    return {"alpha": alpha, "order": order, "seeded": seeded, "over_seeds": over_seeds, "claims": claims,
            "anova": anova, "anova_plain": anova_plain, "over_prompts": over_prompts, "seed_pairs": pairs,
            "single_seed": sorted(set(runs) - set(seeded)), "seed_sd": math.sqrt(statistics.mean(within)),
            "baseline": baseline,
            "mean_sd": statistics.stdev([statistics.mean(r.metrics["accuracy"] for r in seeded[k]) for k in order]),
            "trained_above_baseline": sum(r.metrics["accuracy"] > baseline for v in seeded.values() for r in v),
            "trained_runs": sum(len(v) for v in seeded.values())}


def _seeds(a: dict, arm: str, metric: str) -> str:
    return " / ".join(f"{r.metrics[metric]:.2f}" for r in sorted(a["seeded"][arm], key=lambda r: r.name))


def _sign_p(above: int, n: int) -> float:
    """P(at least `above` of `n` runs above the untrained model) if training moved accuracy up or down at random."""
    return sum(math.comb(n, k) for k in range(above, n + 1)) / 2 ** n


def _p(x: float) -> str:
    return f"{x:.2g}" if math.isfinite(x) else "n/a"


def report(a: dict) -> str:
    """The markdown that docs/algorithms.md summarises."""
    alpha, seeds = a["alpha"], a["over_seeds"]
    tests = {(t["arm"], t["metric"]): t for t in seeds["tests"]}
    smallest = min((t for t in seeds["tests"] if math.isfinite(t["p"])), key=lambda t: t["p"])
    f, d1, d2, p = a["anova"]
    fp, d1p, d2p, pp = a["anova_plain"]
    lines = [
        f"Generated by `python benchmarks/algorithms_significance.py` from `docs/algorithms_table.json` "
        f"(no run repeated); α = {alpha}, Holm's correction within each family below.", "",
        "## The comparison's claims, over seeds", "",
        "| claim | metric | reference (seeds) | other (seeds) | Δ [95 % CI] | p | Holm p |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for t, (_, ref, other, metric) in zip(a["claims"], CLAIMS):
        lines.append(f"| {t.metric} | {metric} | {ref} {_seeds(a, ref, metric)} | {other} {_seeds(a, other, metric)} | "
                     f"{t.diff:+.3f} [{t.low:+.2f}, {t.high:+.2f}] | {_p(t.p)} | {_p(t.p_holm)} |")
    lines += [
        "", f"Welch's t with two seeds per arm (1–2 degrees of freedom); Holm over the {len(CLAIMS)} claims.", "",
        "## Over seeds: every preset against GRPO", "",
        f"{seeds['statement']}", "",
        f"Family: {len(a['order']) - 1} presets × {len(METRICS)} metrics ({', '.join(METRICS)}) = "
        f"{len(seeds['tests'])} Welch tests, two seeds per arm. The smallest unadjusted p is {_p(smallest['p'])} "
        f"({smallest['arm']}, {smallest['metric']}).", "",
        "| preset | held-out acc. (seeds) | Δ acc. vs GRPO [95 % CI] | p | Holm p | Δ mean entropy | Holm p |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for k in a["order"]:
        accs = _seeds(a, k, "accuracy")
        if k == "grpo":
            lines.append(f"| grpo (reference) | {accs} | | | | | |")
            continue
        t, e = tests[(k, "accuracy")], tests[(k, "mean_entropy")]
        lines.append(f"| {k} | {accs} | {t['diff']:+.3f} [{t['low']:+.2f}, {t['high']:+.2f}] | {_p(t['p'])} | "
                     f"{_p(t['p_holm'])} | {e['diff']:+.2f} | {_p(e['p_holm'])} |")
    lines += [
        "", f"One-way ANOVA of held-out accuracy over the {len(a['order'])} presets with two seeds: "
        f"F({d1}, {d2}) = {f:.2f}, p = {p:.2f}; without the two several-steps-per-batch rows "
        f"F({d1p}, {d2p}) = {fp:.2f}, p = {pp:.2f}. The seeds of one preset differ by {a['seed_sd']:.3f} (pooled "
        f"standard deviation of one run); the preset means spread by {a['mean_sd']:.3f}, about what two-seed "
        f"means scatter by ({a['seed_sd'] / math.sqrt(2):.3f}) when every preset is the same.", "",
        "## Over prompts only (seed noise ignored)", "",
        f"{a['over_prompts']['statement']}", "",
        "Each arm pools its seeds' 100 graded problems; the per-problem grades were not kept, so runs are "
        "rebuilt from their accuracy and resampled unpaired.", "",
        "## The two seeds of one preset against each other (over prompts)", "",
        "| preset | seed 0 | seed 1 | Δ [95 % CI] | p | Holm p |", "|---|---:|---:|---:|---:|---:|",
    ]
    for t in a["seed_pairs"]:
        lines.append(f"| {t.metric} | {t.reference:.2f} | {t.other:.2f} | {t.diff:+.2f} [{t.low:+.2f}, {t.high:+.2f}] "
                     f"| {_p(t.p)} | {_p(t.p_holm)} |")
    above, n = a["trained_above_baseline"], a["trained_runs"]
    lines += ["", f"Left out (one seed, identical to GRPO's seed 0): {', '.join(a['single_seed'])}.",
              f"Untrained model: {a['baseline']:.2f}; {above} of {n} trained runs end above it (sign test, "
              f"one-sided p = {_p(_sign_p(above, n))}).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=HERE.parent / "docs" / "algorithms_table.json")
    p.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--bootstrap", type=int, default=10000, help="resamples over prompts")
    a = p.parse_args(argv)
    analysis = analyse(json.loads(a.results.read_text()), a.alpha, a.bootstrap)
    md = report(analysis)
    if a.out:
        a.out.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
