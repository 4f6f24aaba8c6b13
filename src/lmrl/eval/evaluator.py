"""Held-out evaluation: greedy accuracy, and pass@k from sampled completions."""
from __future__ import annotations

import torch

from lmrl.config import EvalConfig
from lmrl.engines.base import SamplingParams
from lmrl.envs.single_turn import rollout
from lmrl.eval.metrics import mean_pass_at_k
from lmrl.rewards.compute import RewardScorer
from lmrl.types import Group


def _correct(groups: list[Group], component: str) -> list[list[bool]]:
    return [[s.excluded is None and s.rewards.get(component, 0.0) >= 1.0 for s in g.samples] for g in groups]


def evaluate(engine, tokenizer, rows: list[dict], scorer: RewardScorer, cfg: EvalConfig,
             max_new_tokens: int, accuracy_component: str, seed: int = 0) -> tuple[dict[str, float], list[Group]]:
    """Greedy accuracy on `rows` (and pass@k with `cfg.samples` sampled completions per row)."""
    rows = rows[: cfg.num_prompts] if cfg.num_prompts else rows
    if not rows:
        return {}, []
    budget = cfg.max_new_tokens or max_new_tokens
    greedy_groups: list[Group] = []
    for start in range(0, len(rows), cfg.batch_size):
        chunk = rows[start: start + cfg.batch_size]
        greedy_groups += rollout(engine, tokenizer, chunk, 1, SamplingParams(max_new_tokens=budget, greedy=True))
    scorer.score(greedy_groups)
    correct = _correct(greedy_groups, accuracy_component)
    lengths = [s.num_generated for g in greedy_groups for s in g.samples]
    metrics = {
        "eval/accuracy": sum(c[0] for c in correct) / len(correct),
        "eval/response_length": sum(lengths) / len(lengths),
        "eval/num_prompts": float(len(rows)),
    }
    if cfg.samples > 1:
        gen = torch.Generator().manual_seed(seed)
        params = SamplingParams(max_new_tokens=budget, temperature=cfg.temperature)
        sampled: list[Group] = []
        per_batch = max(1, cfg.batch_size // cfg.samples)
        for start in range(0, len(rows), per_batch):
            sampled += rollout(engine, tokenizer, rows[start: start + per_batch], cfg.samples, params, gen)
        scorer.score(sampled)
        sampled_correct = _correct(sampled, accuracy_component)
        for k in cfg.pass_k:
            if k <= cfg.samples:
                metrics[f"eval/pass@{k}"] = mean_pass_at_k(sampled_correct, k)
    return metrics, greedy_groups
