"""Episode shapes of the shipped environments: turns, tokens and the share of them the loss masks out.

    python benchmarks/episode_stats.py [--recipes tool_use,code_interpreter,...] [--rows 8] [--n 4]

For each recipe (its model, task, environment and sampling as shipped) plays `--n` sampled episodes
on each of `--rows` training rows with the untrained policy, and prints per environment: turns
(mean, max), episode tokens after the prompt (p50, p90, max), the share of those tokens that are
the environment's (masked out of the loss), truncated and excluded episodes, the mean episode
reward, and the seconds it took.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from machine import cpu_model, load_average

RECIPES = "tool_use,code_interpreter,search,bandit,guessing,revise,negotiation,doctor,sales"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stats(recipe: str, rows: int, n: int) -> str:
    from lmrl.envs import rollout
    from lmrl.loading import load_config
    from lmrl.loops import build_stages

    cfg = load_config(recipe, [f"task.num_train={max(rows, 8)}", "task.num_eval=0", "eval.at_start=false"])
    s = build_stages(cfg)
    t0 = time.perf_counter()
    groups = rollout(s.engine, s.tokenizer, s.sampler.next_prompts(rows), n, s.params,
                     torch.Generator().manual_seed(0), cfg.env)
    s.scorer.score(groups)
    seconds = time.perf_counter() - t0
    samples = [x for g in groups for x in g.samples]
    turns = [x.info.get("turns", 1) for x in samples]
    tokens = [len(x.completion_ids) for x in samples]
    masked = sum(len(x.completion_ids) - x.num_generated for x in samples) / max(sum(tokens), 1)
    rewards = [x.reward for x in samples if x.excluded is None and x.reward is not None]
    return (f"| {recipe} | {cfg.env.name} | {len(samples)} | {statistics.mean(turns):.1f} / {max(turns)} | "
            f"{percentile(tokens, 0.5)} / {percentile(tokens, 0.9)} / {max(tokens)} | {masked:.0%} | "
            f"{sum(x.finish_reason == 'length' for x in samples) / len(samples):.0%} | "
            f"{sum(x.excluded is not None for x in samples)} | "
            f"{statistics.mean(rewards) if rewards else float('nan'):.2f} | {seconds:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default=RECIPES)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    a = ap.parse_args()
    print(f"CPU: {cpu_model()}; load average {load_average()}; {a.rows} rows × {a.n} sampled episodes each, "
          "untrained policy, recipes as shipped\n")
    print("| recipe | env | episodes | turns mean / max | tokens p50 / p90 / max | env tokens (masked) | "
          "truncated | excluded | reward | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for recipe in a.recipes.split(","):
        print(stats(recipe, a.rows, a.n), flush=True)


if __name__ == "__main__":
    main()
