"""The stage of every completion token and the per-stage and global scores, for StructPO's estimator.

StructPO (docs/methods/structpo.md) — confidence: low — reconstructed from the abstract. Knobs of
`algo.advantage_params`: `stages` (the stage names, tags `<name>`; default background, gap, method,
contributions), `scores_from` (the reward component whose named parts `<component>/<stage>` and
`<component>/global` hold the scores; default `structpo_rules`) and `format_penalty` (default 0.1).

`stage_tokens` [B, T-1] is aligned with `completion_mask` like every per-token input: completion token j of a
row at position len(prompt_ids) − 1 + j, the index of the stage whose span (`rewards.stages.stage_spans`)
holds the character it starts at, −1 elsewhere. A stage without a span scores 0 whatever its component
said, and a reply whose layout is not well formed has `format_penalty` taken off its global score.

`refine_pairs` pairs each group's rollouts for the `structpo_refine` term from those stage scores
(`algos.structured_credit.refinement_pairs`; its knob `min_gain`, default 0).
"""
from __future__ import annotations

import bisect

import torch

from lmrl.algos.structured_credit import refinement_pairs
from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.rewards.language_id import decoded_pieces
from lmrl.rewards.stages import DEFAULT_STAGES, stage_spans
from lmrl.types import Batch, Sample

DEFAULT_SCORES_FROM = "structpo_rules"


def token_stages(sample: Sample, tokenizer, stages) -> tuple[list[int], list[bool], bool]:
    """(the stage index of each completion token or −1, whether each stage has a span, whether the layout is well
    formed), on the decoded completion."""
    pieces = decoded_pieces(sample.completion_ids, tokenizer)
    text = "".join(p for _, _, p in pieces)
    spans, well_formed = stage_spans(text, stages)
    starts, offset = [], 0
    for _, _, piece in pieces:
        starts.append(offset)
        offset += len(piece)
    out = [-1] * len(sample.completion_ids)
    for k, span in enumerate(spans):
        if span is None:
            continue
        first = bisect.bisect_right(starts, span[0]) - 1  # the piece that holds the tag's first character
        last = bisect.bisect_left(starts, span[1])  # the first piece starting at or after the span's end
        for start, end, _ in pieces[max(first, 0): last]:
            out[start:end] = [k] * (end - start)
    return out, [s is not None for s in spans], well_formed


def stage_score(sample: Sample, key: str) -> float:
    value = sample.rewards.get(key)
    if value is None:
        raise ValueError(f"structpo reads the reward part {key!r}, which this sample lacks (it has "
                         f"{sorted(sample.rewards) or 'none'}): add the component that returns it to reward.components "
                         "or set algo.advantage_params.scores_from")
    return float(value)


@PROVIDERS.register("stages", "StructPO: the stage of each completion token [B, T-1] (-1 outside), the per-stage "
                    "scores [B, S] and the global scores [B] from a reward component's named parts",
                    provides={"stage_tokens", "stage_scores", "global_scores"}, needs={"cfg", "samples", "tokenizer"})
def stage_inputs(batch: Batch, ctx: InputContext) -> None:
    knobs = ctx.cfg.algo.advantage_params
    stages = list(knobs.get("stages", DEFAULT_STAGES))
    source, penalty = knobs.get("scores_from", DEFAULT_SCORES_FROM), float(knobs.get("format_penalty", 0.1))
    tokens = torch.full_like(batch.completion_mask, -1, dtype=torch.long)
    scores, global_scores = [], []
    for row, x in enumerate(ctx.samples):
        stage_of, present, well_formed = token_stages(x, ctx.tokenizer, stages)
        offset = len(x.prompt_ids) - 1
        tokens[row, offset: offset + len(stage_of)] = torch.tensor(stage_of, dtype=torch.long)
        scores.append([stage_score(x, f"{source}/{s}") if has else 0.0 for s, has in zip(stages, present)])
        global_scores.append(stage_score(x, f"{source}/global") - (0.0 if well_formed else penalty))
    batch.extras["stage_tokens"] = tokens
    batch.row_extras["stage_scores"] = torch.tensor(scores, dtype=torch.float)
    batch.row_extras["global_scores"] = torch.tensor(global_scores, dtype=torch.float)


@PROVIDERS.register("refine_pairs", "StructPO's refinement pairs: each group's rollout with the lowest weakest-stage "
                    "score and the peer best on that stage, as `refine_pair` [B] (-1: none) and `refine_chosen` [B]",
                    provides={"refine_pair", "refine_chosen"}, needs={"cfg"})
def refine_pair_inputs(batch: Batch, ctx: InputContext) -> None:
    if "stage_scores" not in batch.row_extras:
        raise ValueError("the structpo_refine term pairs rollouts by their stage scores: set algo.advantage=structpo")
    term = next((t for t in ctx.cfg.algo.terms if t.name == "structpo_refine"), None)
    min_gain = float(term.params.get("min_gain", 0.0)) if term is not None else 0.0
    pair, chosen = refinement_pairs(batch.row_extras["stage_scores"], batch.group_index, min_gain)
    batch.row_extras["refine_pair"], batch.row_extras["refine_chosen"] = pair, chosen
