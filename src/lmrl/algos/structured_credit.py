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
from lmrl.algos.losses import LossInputs
from lmrl.algos.preference import Pairs, lengths, sequence_logp
from lmrl.algos.preference_losses import dpo_loss, dpo_problem
from lmrl.algos.terms import TERMS
from lmrl.stats import component_advantages, group_normalise, group_slots

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


def refinement_pairs(stage_scores: torch.Tensor, group_index: torch.Tensor, min_gain: float = 0.0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(`refine_pair` [B]: each row's pair id, its group's slot, or −1 outside a pair; `refine_chosen` [B]: 1.0 on
    a pair's refined row). In each group of two or more rows the original is the row whose weakest stage (the
    lowest of its stage scores) is the lowest; the refined one is the peer with the highest score on that stage,
    paired when it beats the original there by more than `min_gain`. Ties go to the earlier row."""
    pair = torch.full((stage_scores.shape[0],), -1, dtype=torch.long)
    chosen = torch.zeros(stage_scores.shape[0])
    slot, _ = group_slots(group_index)
    for g in slot.unique().tolist():
        rows = (slot == g).nonzero().flatten()
        if rows.numel() < 2:
            continue
        weakest, stage = stage_scores[rows].min(1)
        original = int(torch.argmin(weakest))
        k = int(stage[original])
        peers = [i for i in range(rows.numel()) if i != original]
        best = max(peers, key=lambda i: (float(stage_scores[rows[i], k]), -i))
        if float(stage_scores[rows[best], k] - stage_scores[rows[original], k]) > min_gain:
            pair[rows[[original, best]]] = g
            chosen[rows[best]] = 1.0
    return pair, chosen


def check_refine(cfg, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
                 min_gain: float = 0.0, **_) -> str | None:
    if cfg.algo.advantage != "structpo":
        return "reads the structpo stage scores: set algo.advantage=structpo"
    if min_gain < 0:
        return f"min_gain must be >= 0 (got {min_gain})"
    return dpo_problem(beta, loss_type, label_smoothing)


@TERMS.register("structpo_refine", "StructPO's refinement term: DPO on (refined, original) pairs of a step's own "
                "rollouts, the refined one the peer that improves the original's weakest stage",
                inputs={"logp", "ref_logp", "refine_pair", "refine_chosen", "stage_scores"}, denominator="sequences",
                pairwise=True, check=check_refine, provided={"refine_pair", "refine_chosen"},
                settings={"min_gain": 0.0})
def structpo_refine(inputs: LossInputs, mask: torch.Tensor, beta: float = 0.1, loss_type: str = "sigmoid",
                    label_smoothing: float = 0.0):
    """`dpo_loss` with h = Σ (logπ − logπ_ref) over each completion, on the pairs of `refinement_pairs`; each
    pair's loss sits on its refined row, so the term is Σ_pairs DPO / the batch's rows (rows outside a pair add
    0: a step with fewer pairs pulls less)."""
    pair, refined = inputs.extras["refine_pair"].long(), inputs.extras["refine_chosen"]
    per_row = torch.zeros(pair.shape[0], dtype=inputs.logp.dtype, device=inputs.logp.device)
    paired = pair >= 0
    if not bool(paired.any()):
        return per_row, {"structpo/refine_pairs": 0.0}
    pairs = Pairs.of({"pair": pair[paired], "chosen": refined[paired]})
    h = sequence_logp(inputs.logp - inputs.ref_logp, mask)[paired]
    loss, chosen_reward, rejected_reward = dpo_loss(*pairs.split(h), beta, loss_type, label_smoothing,
                                                    *pairs.split(lengths(mask[paired])))
    per_row[paired] = (pairs.on_rows(loss) * refined[paired]).to(per_row.dtype)
    return per_row, {"structpo/refine_loss": float(loss.detach().mean()), "structpo/refine_pairs": float(len(loss)),
                     "structpo/refine_margin": float((chosen_reward - rejected_reward).mean())}
