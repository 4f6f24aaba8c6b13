"""Pre-RL hit counts of a recall task's facts: how often the model recalls each fact when sampled k times, and
the study's split of the facts by that count (docs/rewards/recall.md, "What to measure").

    python -m lmrl.task_files hit_counts RECIPE OUT.jsonl [overrides] [--samples 128] [--rows N]

For each training row, `samples` completions at the recipe's rollout settings, graded by the recipe's accuracy
component alone; h = the number graded correct. A written row is the task row with `hits` (h), `samples` (k) and
`hit_split` ("h=0" never recalled, "1-16" in the tail, ">16"), so a split is trained on or dropped with a filter
on that field.
"""
from __future__ import annotations

from collections.abc import Callable

from lmrl.engines import sampling_params
from lmrl.envs import rollout
from lmrl.rewards import RewardScorer
from lmrl.rewards.compute import accuracy_verdict, grader_only
from lmrl.rewards.recall import hit_split
from lmrl.types import Group

ENCODED_FIELDS = ("prompt_ids",)  # the encoded prompt, left out of the written rows


def hit_row(group: Group, accuracy_component: str) -> dict:
    """The group's task row with its hit count over the group's samples (graded by `accuracy_component`)."""
    hits = sum(accuracy_verdict(s, accuracy_component) is True for s in group.samples)
    row = {k: v for k, v in group.row.items() if k not in ENCODED_FIELDS}
    return {**row, "hits": hits, "samples": len(group.samples), "hit_split": hit_split(hits, len(group.samples))}


def hit_count_rows(cfg, rows: list[dict], engine, tokenizer, samples: int = 128, generator=None,
                   advance: Callable[[int], None] | None = None) -> list[dict]:
    """`hit_row` of each of `rows` (encoded training rows) with `samples` completions of its prompt by the
    model behind `engine`, `rollout.prompts_per_step` prompts an engine call; `advance(n)` after each call."""
    if samples < 1:
        raise ValueError(f"hit counts need samples >= 1, got {samples}")
    params, scorer = sampling_params(cfg), RewardScorer(grader_only(cfg.reward))
    out = []
    for start in range(0, len(rows), cfg.rollout.prompts_per_step):
        part = rows[start: start + cfg.rollout.prompts_per_step]
        groups = rollout(engine, tokenizer, part, samples, params, generator)
        scorer.score(groups)
        out.extend(hit_row(g, cfg.reward.accuracy_component) for g in groups)
        if advance is not None:
            advance(len(part))
    return out
