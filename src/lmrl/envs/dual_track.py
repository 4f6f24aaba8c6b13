"""EqLen's dual-track rollouts (specs algorithms §9, docs/methods/eqlen.md) — confidence: low, reconstructed from
the abstract.

A prompt's n completions are n/2 pairs of tracks decoded together. When the shorter track of a pair ends, at ℓ
tokens (its EOS included), the comparison unit is the first ℓ tokens of both: the longer track's tail is left out
of the loss (`Completion.loss_mask` 0 there, so it counts in no token denominator, KL or entropy term either),
while the whole track is still scored, so every reward is a full response's. The abstract's prefix inheritance
(the longer track continued from its first ℓ tokens until it ends) gives the same tokens, in distribution, as
sampling the track whole, so one engine call samples both tracks and the tail is that continuation. An odd last
track is its own pair and keeps its full length. `info["eqlen"] = {"pair", "segment"}` records the pair (within
the group) and ℓ; the `eqlen` advantage pairs consecutive rows of a group, which are these pairs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel, ConfigDict

from lmrl.envs.controllers import ROLLOUT_CONTROLLERS

if TYPE_CHECKING:
    from lmrl.engines.base import Completion, SamplingParams


class DualTrackParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@ROLLOUT_CONTROLLERS.register("dual_track", "EqLen: pairs of tracks; the longer's tail past the shorter's end is "
                                            "scored but left out of the loss")
class DualTrack:
    def __init__(self, tokenizer=None, **params):
        DualTrackParams(**params)

    def complete(self, engine, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        return [segmented(tracks) for tracks in engine.generate(prompts, n, params, generator)]


def segmented(tracks: list[Completion]) -> list[Completion]:
    """The prompt's tracks, paired in order (0-1, 2-3, …), each masked to its pair's shorter length."""
    out = []
    for start in range(0, len(tracks), 2):
        pair = tracks[start:start + 2]
        segment = min(len(c.token_ids) for c in pair)
        for c in pair:
            mask = [1] * segment + [0] * (len(c.token_ids) - segment)
            out.append(replace(c, loss_mask=mask, info={**c.info, "eqlen": {"pair": start // 2, "segment": segment}}))
    return out
