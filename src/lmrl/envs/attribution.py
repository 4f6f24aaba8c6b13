"""Delayed per-turn reward attribution with eligibility gating (MindGames, specs §1.17).

In games whose outcome appears only at the end, an environment's last `Step` can attribute the
outcome back to every turn: `delayed_attribution` gives each valid turn the outcome R (+R for a win,
−R for a loss: pass the signed outcome), each invalid move a fixed penalty, and marks turns whose
information never materialised as ineligible. The runner (`envs.episodes`) reads the two lists from
the last step's info: `turn_rewards` replaces the per-turn rewards, `turn_eligible` takes ineligible
turns' tokens out of the loss (and their reward out of the episode's return). With the
`turn_discounted` estimator at γ = 0, each turn is trained on its own attributed reward.

Confidence: low — reconstructed from the paper's abstract (arXiv 2606.00017): the attribution map
and the eligibility rule follow the spec's inferred rule, not released code.
"""
from __future__ import annotations


def delayed_attribution(outcome: float, valid: list[bool], eligible: list[bool] | None = None,
                        invalid_penalty: float = -0.5) -> dict[str, list]:
    """The `Step.info` entries that attribute a finished episode's `outcome` to its turns.

    Valid turns get `outcome`, invalid ones `invalid_penalty`; `eligible` (default all) says which
    turns stay in the loss. Returns {"turn_rewards": [...], "turn_eligible": [...]}.
    """
    eligible = [True] * len(valid) if eligible is None else list(eligible)
    if len(eligible) != len(valid):
        raise ValueError(f"valid has {len(valid)} turns but eligible has {len(eligible)}")
    rewards = [float(outcome) if ok else float(invalid_penalty) for ok in valid]
    return {"turn_rewards": rewards, "turn_eligible": [bool(x) for x in eligible]}
