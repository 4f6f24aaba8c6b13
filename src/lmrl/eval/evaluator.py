"""Held-out evaluation: greedy accuracy, and pass@k and majority-vote accuracy from sampled completions."""
from __future__ import annotations

from collections import Counter

import torch

from lmrl.config import EnvConfig, EvalConfig
from lmrl.engines.base import SamplingParams
from lmrl.envs.single_turn import rollout
from lmrl.eval.metrics import mean_pass_at_k
from lmrl.rewards.compute import RewardScorer
from lmrl.rewards.gaming import gaming_share
from lmrl.rewards.group import answer_classes, sample_answer
from lmrl.types import Group


def _correct(groups: list[Group], component: str) -> list[list[bool]]:
    return [[s.excluded is None and s.rewards.get(component, 0.0) >= 1.0 for s in g.samples] for g in groups]


def majority_correct(groups: list[Group], correct: list[list[bool]]) -> list[bool]:
    """Per problem: whether the most frequent answer of its samples (ties: the first seen; the last
    number of a reply without an 'Answer:' marker) is a correct one. Problems with no answer: False."""
    out = []
    for group, right in zip(groups, correct):
        ids = answer_classes([sample_answer(s, fallback="last_number") for s in group.samples])
        votes = Counter(i for i in ids if i is not None)
        label = votes.most_common(1)[0][0] if votes else None
        out.append(label is not None and any(r for i, r in zip(ids, right) if i == label))
    return out


def episode_metrics(groups: list[Group]) -> dict[str, float]:
    """The mean episode reward and the mean of each metric the environment reported, as `eval/...`."""
    samples = [x for g in groups for x in g.samples]
    scored = [x.reward for x in samples if x.excluded is None and x.reward is not None]
    out = {"eval/reward": sum(scored) / len(scored) if scored else float("nan")}
    for name in sorted({k for x in samples for k in x.info.get("metrics", {})}):
        values = [x.info["metrics"][name] for x in samples if name in x.info.get("metrics", {})]
        out[f"eval/{name}"] = sum(values) / len(values)
    return out


def evaluate(engine, tokenizer, rows: list[dict], scorer: RewardScorer, cfg: EvalConfig,
             max_new_tokens: int, accuracy_component: str, seed: int = 0,
             env: EnvConfig | None = None) -> tuple[dict[str, float], list[Group]]:
    """Greedy accuracy on `rows`; with `cfg.samples` > 1 sampled completions per row, pass@k and
    maj@n (the accuracy of each problem's majority answer: what label-free majority-vote training
    can at best teach). With an `env` naming an environment, each row is a greedy episode (the
    environment's randomness seeded from `seed`, so every evaluation plays the same episodes) and
    the environment's own metrics are reported too (`eval/env/...`)."""
    rows = rows[: cfg.num_prompts] if cfg.num_prompts else rows
    if not rows:
        return {}, []
    budget = cfg.max_new_tokens or max_new_tokens
    episodes = env is not None and env.name is not None
    episode_seeds = torch.Generator().manual_seed(seed) if episodes else None
    greedy_groups: list[Group] = []
    for start in range(0, len(rows), cfg.batch_size):
        chunk = rows[start: start + cfg.batch_size]
        greedy_groups += rollout(engine, tokenizer, chunk, 1, SamplingParams(max_new_tokens=budget, greedy=True),
                                 episode_seeds, env)
    scorer.score(greedy_groups)
    correct = _correct(greedy_groups, accuracy_component)
    lengths = [s.num_generated for g in greedy_groups for s in g.samples]
    metrics = {
        "eval/accuracy": sum(c[0] for c in correct) / len(correct),
        "eval/response_length": sum(lengths) / len(lengths),
        "eval/num_prompts": float(len(rows)),
        "eval/gaming_restated_question": gaming_share([s for g in greedy_groups for s in g.samples],
                                                      accuracy_component),
    }
    if episodes:
        metrics.update(episode_metrics(greedy_groups))
    if cfg.samples > 1:
        gen = torch.Generator().manual_seed(seed)
        params = SamplingParams(max_new_tokens=budget, temperature=cfg.temperature)
        sampled: list[Group] = []
        per_batch = max(1, cfg.batch_size // cfg.samples)
        for start in range(0, len(rows), per_batch):
            sampled += rollout(engine, tokenizer, rows[start: start + per_batch], cfg.samples, params, gen, env)
        scorer.score(sampled)
        sampled_correct = _correct(sampled, accuracy_component)
        for k in cfg.pass_k:
            if k <= cfg.samples:
                metrics[f"eval/pass@{k}"] = mean_pass_at_k(sampled_correct, k)
        majority = majority_correct(sampled, sampled_correct)
        metrics[f"eval/maj@{cfg.samples}"] = sum(majority) / len(majority)
    return metrics, greedy_groups
