"""Advantage estimators over several rewards per sample: GDPO, RVPO, ALPO.

Each reward is normalised within its group on its own, so that one dense reward cannot drown a
sparse one, and the per-reward advantages are then combined: summed (GDPO), by a SoftMin (RVPO), or
routed to the tokens of the reward's own modality (ALPO). Formulas and deviations:
docs/methods/{gdpo,rvpo,alpo}.md. The group z-scores and the SoftMin are shared with the reward
aggregations in `lmrl.stats`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from lmrl.algos.advantages import ADVANTAGES, required, sequence_scores, to_tokens
from lmrl.stats import component_advantages, group_normalise, softmin_aggregate


def _batch_zscore(values: torch.Tensor, eps: float) -> torch.Tensor:
    std = values.std() if values.numel() > 1 else torch.ones((), dtype=values.dtype)
    return (values - values.mean()) / (std + eps)


@ADVANTAGES.register("gdpo", "GDPO: per-reward group normalisation, weighted sum, batch z-score",
                     requires={"components"}, group_relative=True)
def gdpo(token_rewards, group_index, mask, components=None, component_weights: Sequence[float] | None = None,
         eps: float = 1e-4, batch_norm: bool = True, **_):
    """GDPO (NVlabs/GDPO; docs/methods/gdpo.md) — confidence high for the released code.

    Normalises each reward component within its group before combining, so one dense reward
    cannot drown a sparse one: A_i = z_batch(Σ_k w_k A_{i,k}). `components` [B, K]; NaN
    components are skipped (the reference's nansum). eps = 1e-4 as in the reference.
    """
    adv = component_advantages(required("components", components), group_index, eps)
    w = (torch.ones(adv.shape[1]) if component_weights is None
         else torch.as_tensor(component_weights, dtype=adv.dtype))
    total = (adv * w).nansum(dim=1)
    return to_tokens(_batch_zscore(total, eps) if batch_norm else total, mask)


@ADVANTAGES.register("rvpo", "RVPO: SoftMin (temperature tau) over per-reward group advantages",
                     requires={"components"}, group_relative=True)
def rvpo(token_rewards, group_index, mask, components=None, tau: float = 1.0, eps: float = 1e-4,
         batch_norm: bool = False, **_):
    """RVPO (arXiv 2605.05750; docs/methods/rvpo.md) — confidence medium-low (τ and the normalisation
    were not retrieved).

    Aggregates K rewards with a SoftMin of their GDPO advantages instead of a sum, penalising
    reward variance so a sample failing one constraint is not carried by the others. Optional
    batch z-score as GDPO does (off by default: the method page presents it as optional).
    """
    adv = component_advantages(required("components", components), group_index, eps)
    total = softmin_aggregate(adv, tau)
    return to_tokens(_batch_zscore(total, eps) if batch_norm else total, mask)


def modality_mask(token_ids: torch.Tensor, speech_id_range: Sequence[int]) -> torch.Tensor:
    """1.0 where the predicted token id lies in [start, end) of the speech vocabulary, else 0.0."""
    start, end = speech_id_range
    return ((token_ids >= start) & (token_ids < end)).float()


@ADVANTAGES.register("alpo", "ALPO: text tokens get the text-reward GRPO advantage, speech tokens the acoustic one",
                     requires={"acoustic_rewards", "speech_mask"}, group_relative=True)
def alpo(token_rewards, group_index, mask, acoustic_rewards=None, speech_mask=None, text_rewards=None,
         eps: float = 1e-6, **_):
    """ALPO, acoustic-lexical decoupled PO (docs/methods/alpo.md) — confidence medium-low (routing
    explicit; GRPO normalisation assumed).

    One speech-text rollout carries two rewards; each token is credited with the reward of its
    own modality: A_{i,t} = GRPO(r^text)_i on text tokens, GRPO(r^acoustic)_i on speech tokens.
    `acoustic_rewards` [B]; `speech_mask` [B, T] (1 = speech token, see `modality_mask`);
    `text_rewards` [B] defaults to the sequence reward.
    """
    acoustic = required("acoustic_rewards", acoustic_rewards).float()
    speech = required("speech_mask", speech_mask).float()
    text = sequence_scores(token_rewards) if text_rewards is None else text_rewards.float()
    a_text = group_normalise(text, group_index, eps).unsqueeze(1)
    a_ac = group_normalise(acoustic, group_index, eps).unsqueeze(1)
    return (speech * a_ac + (1 - speech) * a_text) * mask
