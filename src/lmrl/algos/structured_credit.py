"""StructPO's struct-aware advantage: each stage's tokens credited by that stage's score and the global score.

StructPO (docs/methods/structpo.md) — confidence: low — reconstructed from the abstract. For the tokens of
stage k of rollout i, A_{i,t} = α·z_k(s_{i,k}) + (1−α)·z(g_i): z_k the group z-score of the stage-k scores
over the G rollouts of the prompt, z that of the global scores, GRPO's normalisation (unbiased std, + eps,
singleton groups mean 0 and std 1). Tokens outside every stage span (text before the first tag, or the text
of a stage whose tag is missing or out of order, when it comes first) get the global part (1−α)·z(g_i)
alone. The inputs come from the `stages` provider (`inputs.stages`): `stage_tokens` [B, T] (the stage of
each token, −1 outside), `stage_scores` [B, S] and `global_scores` [B].
"""
from __future__ import annotations

import torch

from lmrl.algos.advantages import ADVANTAGES, required
from lmrl.stats import component_advantages, group_normalise

STAGE_INPUTS = frozenset({"stage_tokens", "stage_scores", "global_scores"})


def struct_advantages(stage_tokens: torch.Tensor, stage_scores: torch.Tensor, global_scores: torch.Tensor,
                      group_index: torch.Tensor, mask: torch.Tensor, alpha: float = 0.5,
                      eps: float = 1e-6) -> torch.Tensor:
    """[B, T] advantages from the stage of each token [B, T] (−1: none), the stage scores [B, S] and the global
    scores [B]."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"structpo: alpha must lie in [0, 1] (got {alpha})")
    z_stage = component_advantages(stage_scores, group_index, eps)  # [B, S]
    z_global = group_normalise(global_scores.float(), group_index, eps)  # [B]
    stage = stage_tokens.long()
    local = torch.gather(z_stage, 1, stage.clamp(min=0)) * (stage >= 0)
    return (alpha * local + (1 - alpha) * z_global.unsqueeze(1)) * mask


@ADVANTAGES.register("structpo", "StructPO: a stage's tokens get alpha x the group z-score of that stage's score plus "
                     "(1 - alpha) x the group z-score of the global score", requires=STAGE_INPUTS,
                     group_relative=True, group_local=True)
def structpo(token_rewards, group_index, mask, stage_tokens=None, stage_scores=None, global_scores=None,
             alpha: float = 0.5, eps: float = 1e-6, **_):
    """`struct_advantages`; the sequence reward itself is not read (the scores are)."""
    return struct_advantages(required("stage_tokens", stage_tokens), required("stage_scores", stage_scores),
                             required("global_scores", global_scores), group_index, mask, alpha, eps)
