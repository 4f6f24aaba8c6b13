"""The per-turn rewards of multi-turn episodes as a batch input, for per-turn credit assignment.

The `turn_rewards` provider fills `row_extras["turn_rewards"]` [B, J]: column j is the environment's
reward for the j-th policy turn of the row (the j-th run of policy tokens in the completion mask),
0 where a row has fewer turns or the turn got no reward (a last turn cut by the token budget). The
estimator `turn_discounted` (lmrl.algos.credit_assignment) turns it into per-token advantages.
"""
from __future__ import annotations

import torch

from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.types import Batch, Sample


def turn_reward_row(sample: Sample) -> list[float]:
    """The rewards of the sample's policy turns that hold tokens and are eligible (in the loss), in order."""
    rewards = sample.info.get("turn_rewards") or []
    lengths = sample.info.get("turn_lengths") or [1] * len(rewards)
    eligible = sample.info.get("turn_eligible") or [True] * len(rewards)
    return [r for r, n, ok in zip(rewards, lengths, eligible) if n > 0 and ok]


@PROVIDERS.register("turn_rewards", "per-turn environment rewards [B, J] of multi-turn episodes (0-padded)",
                    needs={"samples"})
def turn_rewards(batch: Batch, ctx: InputContext) -> None:
    rows = [turn_reward_row(x) for x in ctx.samples]
    out = torch.zeros((len(rows), max([len(r) for r in rows] + [1])))
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float)
    batch.row_extras["turn_rewards"] = out
