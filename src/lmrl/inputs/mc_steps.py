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

A generative critic's step values take the continuations' place: GenAC's `genac_value` with a `delimiter`
(`lmrl.rewards.genac`) records in `info["critic_steps"]` each step's end in the reply's text, the critic's
value of the prompt (V(s_0), in place of the group's mean) and of each prefix; `critic_steps` puts each step
end at the first token that starts at or after it. A sample has one kind of step values or none.
"""
from __future__ import annotations

import bisect
import math

import torch

from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.rewards.language_id import decoded_pieces
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
    return chained(kept, math.nan)


def critic_steps(sample: Sample, tokenizer) -> list[tuple[int, int, float, float]]:
    """`sample_steps` from a generative critic's values (`info["critic_steps"]`): V(s_0) the critic's value of
    the prompt, each step end in characters moved to the first token that starts at or after it."""
    if tokenizer is None:
        raise ValueError("mc_step_values: the critic's step ends are characters of the reply; placing them on its "
                         "tokens needs the tokenizer (InputContext.tokenizer)")
    steps, pieces = sample.info["critic_steps"], decoded_pieces(sample.completion_ids, tokenizer)
    starts, offset = [], 0  # the character each piece of tokens starts at
    for _, _, piece in pieces:
        starts.append(offset)
        offset += len(piece)
    n = len(sample.completion_ids)
    ends = [pieces[i][0] if i < len(pieces) else n
            for i in (bisect.bisect_left(starts, e) for e in steps["char_ends"][:-1])]
    return chained([*zip(ends, steps["values"]), (n, math.nan)], float(steps["start"]))


def chained(kept: list[tuple[int, float]], before: float) -> list[tuple[int, int, float, float]]:
    """(start, end, V before, V after) of consecutive steps from (end, V after) pairs; an empty step is dropped,
    its value passed on to the next."""
    out, start = [], 0
    for end, after in kept:
        if end > start:
            out.append((start, end, before, after))
        start, before = end, after
    return out


@PROVIDERS.register("mc_step_values", "per completion token (step j, V(s_j-1), V(s_j)) [B, T-1, 3] from the value-"
                    "only continuations of the mc_steps controller or a generative critic's values; NaN: V(s_0) or "
                    "V(s_m), from the rewards",
                    needs={"groups", "tokenizer"})
def mc_step_values(batch: Batch, ctx: InputContext) -> None:
    out = torch.full((*batch.completion_mask.shape, 3), math.nan)
    out[..., 0] = 0.0
    row = 0
    for group in ctx.groups:
        values = prefix_values(group)
        for sample in group.scored:
            offset = len(sample.prompt_ids) - 1
            if "critic_steps" in sample.info and sample.info.get("steps", {}).get("ends"):
                raise ValueError("mc_step_values: a sample has both Monte-Carlo step values (the mc_steps "
                                 "controller) and a critic's (genac_value with a delimiter); use one")
            critic = "critic_steps" in sample.info
            steps = critic_steps(sample, ctx.tokenizer) if critic else sample_steps(sample, values)
            for j, (start, end, before, after) in enumerate(steps, 1):
                out[row, offset + start: offset + end] = torch.tensor([float(j), before, after])
            row += 1
    batch.extras["mc_step_values"] = out
