"""Held-out evaluation: greedy accuracy, and pass@k and majority-vote accuracy from sampled completions."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lmrl.config import EnvConfig, EvalConfig
from lmrl.engines.base import SamplingParams
from lmrl.envs.single_turn import rollout
from lmrl.eval.metrics import majority, mean_pass_at_k
from lmrl.rewards.compute import RewardScorer, accuracy_verdict
from lmrl.rewards.gaming import gaming_share
from lmrl.rewards.group import answer_classes, sample_answer
from lmrl.types import Group

GREEDY = "greedy"  # the first phase of an evaluation: one greedy reply per row


def graded_flags(groups: list[Group], component: str) -> list[list[bool | None]]:
    """Per group, per sample: `accuracy_verdict`, whether the accuracy component `component` scored it
    correct (None: no verdict)."""
    return [[accuracy_verdict(s, component) for s in g.samples] for g in groups]


def correct_flags(groups: list[Group], component: str) -> list[list[bool]]:
    """Per group, per sample: scored correct by the accuracy component (a sample it gave no verdict: False)."""
    return [[v is True for v in flags] for flags in graded_flags(groups, component)]


def majority_correct(groups: list[Group], correct: list[list[bool]]) -> list[bool]:
    """Per problem: whether the most frequent answer of its samples (ties: the first seen; the last
    number of a reply without an 'Answer:' marker) is a correct one. Problems with no answer: False."""
    return [majority(answer_classes([sample_answer(s, fallback="last_number") for s in group.samples]), right)[0]
            for group, right in zip(groups, correct)]


def reward_metrics(groups: list[Group]) -> dict[str, float]:
    """The mean reward of the scored samples, `eval/reward`, and of each reward component, `eval/reward/<name>`
    (a proxy reward model beside the gold verifier: their held-out curves side by side)."""
    scored = [x for g in groups for x in g.samples if x.excluded is None and x.reward is not None]
    out = {"eval/reward": sum(x.reward for x in scored) / len(scored) if scored else float("nan")}
    for name in sorted({k for x in scored for k in x.rewards}):
        values = [x.rewards[name] for x in scored if name in x.rewards]
        out[f"eval/reward/{name}"] = sum(values) / len(values)
    return out


def episode_metrics(groups: list[Group]) -> dict[str, float]:
    """The mean of each metric the environment reported, as `eval/...`."""
    samples = [x for g in groups for x in g.samples]
    out = {}
    for name in sorted({k for x in samples for k in x.info.get("metrics", {})}):
        values = [x.info["metrics"][name] for x in samples if name in x.info.get("metrics", {})]
        out[f"eval/{name}"] = sum(values) / len(values)
    return out


def generate_groups(engine, tokenizer, rows: list[dict], n: int, params: SamplingParams, batch_size: int,
                    generator: torch.Generator | None = None, environment: EnvConfig | None = None,
                    advance: Callable[[int], None] | None = None) -> list[Group]:
    """`n` completions per row, in engine calls of about `batch_size` completions; `advance(rows)` after
    each call (a progress bar)."""
    groups: list[Group] = []
    per_batch = max(1, batch_size // n)
    for start in range(0, len(rows), per_batch):
        chunk = rows[start: start + per_batch]
        groups += rollout(engine, tokenizer, chunk, n, params, generator, environment)
        if advance is not None:
            advance(len(chunk))
    return groups


@dataclass
class Replies:
    """One evaluation's scored replies: per held-out row its greedy reply and, with `eval.samples` > 1, its
    sampled ones (`sampled` is None otherwise), in row order."""

    rows: list[dict]
    greedy: list[Group]
    sampled: list[Group] | None
    max_new_tokens: int
    episodes: bool  # each reply is an episode of `env.name`


def held_out_replies(engine, tokenizer, rows: list[dict], scorer: RewardScorer, cfg: EvalConfig,
                     max_new_tokens: int, seed: int = 0, environment: EnvConfig | None = None,
                     advance: Callable[[str, int, int], None] | None = None) -> Replies:
    """The evaluator: the first `eval.num_prompts` of `rows` each get one greedy reply, then (with
    `eval.samples` > 1) `eval.samples` sampled ones at `eval.temperature` from a generator seeded with
    `seed`, all within `eval.max_new_tokens` (else `max_new_tokens`), each set scored by `scorer`. With
    an `environment` naming one, each reply is an episode whose randomness is seeded from `seed` too,
    so every evaluation plays the same episodes. The training loop's held-out metrics (`evaluate`) and
    `lmrl eval`'s suite (`eval.suite.run_suite`) are both computed from what this returns.

    `advance(phase, done, rows)`: at the start of each phase (GREEDY, then "N samples") and after
    each engine call, how many of its `rows` rows are done (a progress display)."""
    rows = rows[: cfg.num_prompts] if cfg.num_prompts else rows
    budget = cfg.max_new_tokens or max_new_tokens
    episodes = environment is not None and environment.name is not None
    replies = Replies(rows, [], None, budget, episodes)
    if not rows:
        return replies

    def phase(name: str, n: int, params: SamplingParams, generator: torch.Generator | None) -> list[Group]:
        done = [0]

        def step(k: int) -> None:
            done[0] += k
            if advance is not None:
                advance(name, done[0], len(rows))

        step(0)
        groups = generate_groups(engine, tokenizer, rows, n, params, cfg.batch_size, generator, environment, step)
        scorer.score(groups, held_out=True)
        return groups

    replies.greedy = phase(GREEDY, 1, SamplingParams(max_new_tokens=budget, greedy=True),
                           torch.Generator().manual_seed(seed) if episodes else None)
    if cfg.samples > 1:
        replies.sampled = phase(f"{cfg.samples} samples", cfg.samples,
                                SamplingParams(max_new_tokens=budget, temperature=cfg.temperature),
                                torch.Generator().manual_seed(seed))
    return replies


def held_out_metrics(replies: Replies, cfg: EvalConfig, accuracy_component: str) -> dict[str, float]:
    """The training loop's `eval/...` metrics of `replies` (see `evaluate`)."""
    greedy_groups = replies.greedy
    graded = [flags[0] for flags in graded_flags(greedy_groups, accuracy_component)]
    verdicts = [v for v in graded if v is not None]
    lengths = [s.num_generated for g in greedy_groups for s in g.samples]
    metrics = {
        "eval/accuracy": sum(verdicts) / len(verdicts) if verdicts else float("nan"),
        "eval/excluded": float(len(graded) - len(verdicts)),
        "eval/response_length": sum(lengths) / len(lengths),
        "eval/num_prompts": float(len(replies.rows)),
        "eval/gaming_restated_question": gaming_share([s for g in greedy_groups for s in g.samples],
                                                      accuracy_component),
    }
    metrics.update(reward_metrics(greedy_groups))
    if replies.episodes:
        metrics.update(episode_metrics(greedy_groups))
    if replies.sampled is not None:
        sampled_graded = graded_flags(replies.sampled, accuracy_component)
        sampled_correct = [[v is True for v in flags] for flags in sampled_graded]
        metrics["eval/excluded_samples"] = float(sum(v is None for flags in sampled_graded for v in flags))
        for k in cfg.pass_k:
            if k <= cfg.samples:
                metrics[f"eval/pass@{k}"] = mean_pass_at_k(sampled_correct, k)
        voted = majority_correct(replies.sampled, sampled_correct)
        metrics[f"eval/maj@{cfg.samples}"] = sum(voted) / len(voted)
    return metrics


def evaluate(engine, tokenizer, rows: list[dict], scorer: RewardScorer, cfg: EvalConfig,
             max_new_tokens: int, accuracy_component: str, seed: int = 0,
             environment: EnvConfig | None = None, advance: Callable[[int, int], None] | None = None
             ) -> tuple[dict[str, float], list[Group]]:
    """The training loop's held-out evaluation: `held_out_replies`, then its metrics, and the greedy groups.

    Greedy accuracy on `rows`; with `cfg.samples` > 1, pass@k and maj@n (the accuracy of each problem's
    majority answer: what label-free majority-vote training can at best teach); with an `environment`,
    the environment's own metrics too (`eval/env/...`). The accuracy is the accuracy component's alone,
    over the prompts it gave a verdict on; those it did not (it erred on them) are counted in
    `eval/excluded`, not as wrong. `advance(done, total)` is told after each engine call how many of the
    rows to generate for, over both phases, are done (a progress display)."""
    phases = 2 if cfg.samples > 1 else 1

    def overall(phase: str, done: int, rows_in_phase: int) -> None:
        advance(done + (0 if phase == GREEDY else rows_in_phase), phases * rows_in_phase)

    replies = held_out_replies(engine, tokenizer, rows, scorer, cfg, max_new_tokens, seed, environment,
                               overall if advance is not None else None)
    if not replies.rows:
        return {}, []
    return held_out_metrics(replies, cfg, accuracy_component), replies.greedy
