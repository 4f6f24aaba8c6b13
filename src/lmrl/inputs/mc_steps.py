"""Monte-Carlo step values of every completion token, for the estimators that credit steps (`algos.mc_step`).

The `mc_steps` rollout controller cuts each completion into steps (`info["steps"]["ends"]`) and samples `k`
value-only continuations from the end of each step but the last; the loop scores them as the group's
`value_groups`. The `mc_step_values` provider fills `extras["mc_step_values"]` [B, T-1, 3], aligned with
`completion_mask` (completion token j of a row at position len(prompt_ids) - 1 + j): on each token of step j
of a row, (j, V(s_{j−1}), V(s_j)), V(s_j) the mean reward of the continuations from the end of step j. NaN
stands for a value the estimator takes from the rewards: V(s_0) before the first step (the group's mean
reward) and V(s_m) after the last (the row's own reward). A step end none of whose continuations got a
reward (every one excluded) is no boundary: its step and the next are one. A sample without steps (no
controller, another source's sample) is one step. Off the completion: (0, NaN, NaN).
"""
from __future__ import annotations

import math

import torch

from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.types import Batch, Group, Sample


def prefix_values(group: Group) -> dict[tuple[str, int], float]:
    """(continued sample's key, prefix end) -> the mean reward of its scored value-only continuations."""
    rewards: dict[tuple[str, int], list[float]] = {}
    for value in group.value_groups:
        for x in value.samples:
            if x.excluded is None and x.reward is not None:
                of = x.info["value_of"]
                rewards.setdefault((of["key"], int(of["end"])), []).append(float(x.reward))
    return {key: sum(r) / len(r) for key, r in rewards.items()}


def sample_steps(sample: Sample, values: dict[tuple[str, int], float]) -> list[tuple[int, int, float, float]]:
    """(start, end, V before, V after) of each step of the sample's completion, NaN for V(s_0) and V(s_m)."""
    n = len(sample.completion_ids)
    steps = sample.info.get("steps", {})
    key, ends = steps.get("key"), [int(e) for e in steps.get("ends", [])]
    if ends and ends[-1] != n:
        raise ValueError(f"info['steps'] ends {ends} must finish at the completion's {n} tokens")
    kept = [(e, values[(key, e)]) for e in ends[:-1] if (key, e) in values] + [(n, math.nan)]
    out, start, before = [], 0, math.nan
    for end, after in kept:
        if end > start:
            out.append((start, end, before, after))
        start, before = end, after
    return out


@PROVIDERS.register("mc_step_values", "per completion token (step j, V(s_j-1), V(s_j)) [B, T-1, 3] from the value-"
                    "only continuations of the mc_steps controller; NaN: V(s_0) or V(s_m), from the rewards",
                    needs={"groups"})
def mc_step_values(batch: Batch, ctx: InputContext) -> None:
    out = torch.full((*batch.completion_mask.shape, 3), math.nan)
    out[..., 0] = 0.0
    row = 0
    for group in ctx.groups:
        values = prefix_values(group)
        for sample in group.scored:
            offset = len(sample.prompt_ids) - 1
            for j, (start, end, before, after) in enumerate(sample_steps(sample, values), 1):
                out[row, offset + start: offset + end] = torch.tensor([float(j), before, after])
            row += 1
    batch.extras["mc_step_values"] = out
