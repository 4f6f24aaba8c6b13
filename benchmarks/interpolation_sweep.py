"""Held-out accuracy along the line from an SFT checkpoint to an RL checkpoint (specs §2.12, docs/merging.md).

    python benchmarks/interpolation_sweep.py SFT RL --recipe quickstart --out sweep.md eval.num_prompts=50

SFT and RL are model directories, lmrl checkpoints or runs (their latest checkpoint; LoRA ones are
merged into their base first). For each λ (default 0, 0.25, 0.5, 0.75, 1) the policy is
θ(λ) = (1−λ)·θ_SFT + λ·θ_RL (or SLERP with `--method slerp`), evaluated greedily on the recipe's
held-out prompts with the recipe's reward, as the in-run evaluation does. The model is built once
and each θ(λ) is loaded into it in memory. The table has the accuracy, the mean response length and
the distance ‖θ(λ) − θ_SFT‖ / ‖θ_RL − θ_SFT‖ (λ itself for linear interpolation).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _distance(state: dict, sft: dict, rl: dict) -> float:
    """‖θ − θ_SFT‖ / ‖θ_RL − θ_SFT‖ over the floating-point tensors (0 when the endpoints coincide)."""
    keys = [k for k in sft if sft[k].is_floating_point()]
    num = sum(float((state[k].double().cpu() - sft[k].double()).pow(2).sum()) for k in keys)
    den = sum(float((rl[k].double() - sft[k].double()).pow(2).sum()) for k in keys)
    return (num / den) ** 0.5 if den > 0 else 0.0


def sweep(sft: str, rl: str, recipe: str = "quickstart", overrides: list[str] | None = None,
          lambdas: tuple[float, ...] = LAMBDAS, method: str = "linear") -> list[dict]:
    """One row per λ: the evaluation metrics of θ(λ) and its distance from the SFT endpoint."""
    from lmrl.eval.evaluator import evaluate
    from lmrl.loading import load_config
    from lmrl.loops.setup import build_stages
    from lmrl.models.loading import load_model
    from lmrl.models.merging import merge_state_dicts, model_directories

    with model_directories([sft, rl]) as dirs:
        states = [load_model(d).state_dict() for d in dirs]
        cfg = load_config(recipe, [*(overrides or []), f"model.path={dirs[0]}", "model.lora=null"])
        s = build_stages(cfg)
        rows = []
        for i, lam in enumerate(lambdas):
            s.model.load_state_dict(merge_state_dicts(states, method, t=lam))
            s.engine.update_weights(None, i + 1)
            metrics, _ = evaluate(s.engine, s.tokenizer, s.eval_rows, s.scorer, cfg.eval, cfg.rollout.max_new_tokens,
                                  cfg.reward.accuracy_component, cfg.trainer.seed, cfg.env)
            rows.append({"lambda": lam, "distance": _distance(s.model.state_dict(), *states), **metrics})
    return rows


def table(rows: list[dict], sft: str, rl: str, method: str) -> str:
    n = int(rows[0].get("eval/num_prompts", 0)) if rows else 0
    lines = [f"Interpolation {method}: λ = 0 is {sft}, λ = 1 is {rl}; greedy accuracy on {n} held-out prompts.", "",
             "| λ | held-out accuracy | mean response length | ‖θ(λ) − θ_SFT‖ / ‖θ_RL − θ_SFT‖ |",
             "|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['lambda']:g} | {r.get('eval/accuracy', float('nan')):.3f} | "
                     f"{r.get('eval/response_length', float('nan')):.1f} | {r['distance']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sft", help="the λ = 0 endpoint (SFT model, checkpoint or run)")
    p.add_argument("rl", help="the λ = 1 endpoint (RL model, checkpoint or run)")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. eval.num_prompts=50")
    p.add_argument("--recipe", default="quickstart", help="the recipe whose held-out prompts and reward are used")
    p.add_argument("--lambdas", default=",".join(f"{x:g}" for x in LAMBDAS), help="comma-separated λ values")
    p.add_argument("--method", choices=["linear", "slerp"], default="linear")
    p.add_argument("--out", help="also write the markdown table to this file")
    p.add_argument("--json", help="also write the rows as JSON to this file")
    args = p.parse_intermixed_args(argv)
    lambdas = tuple(float(x) for x in args.lambdas.split(","))
    rows = sweep(args.sft, args.rl, args.recipe, args.overrides, lambdas, args.method)
    text = table(rows, args.sft, args.rl, args.method)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
