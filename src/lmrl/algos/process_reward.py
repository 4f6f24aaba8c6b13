"""The process reward model's objective term, `prm`: cross-entropy of a 2-class step head at each step's end
(stages §3.2; docs/stages/process_reward_model.md).

The head's classes are (bad, good): index `GOOD` = 1 is a correct step, as in TRL's data, where label 1 (true)
marks one and `AutoModelForTokenClassification`'s logit 1 scores it. A step labelled p (1.0 correct, 0.0
wrong, or a soft label in between) has the loss −(p·log P(good) + (1 − p)·log P(bad)), CE against the target
[1 − p, p] over (bad, good); a hard label is TRL's CE. The term is a token mean over the loss mask, which
marks the step ends alone: the mean over the mini-batch's labelled steps.
"""
from __future__ import annotations

import torch

from lmrl.algos.losses import LossInputs
from lmrl.algos.terms import TERMS

BAD, GOOD = 0, 1


def step_cross_entropy(logits: torch.Tensor, p_good: torch.Tensor) -> torch.Tensor:
    """Per-step CE [...] of (bad, good) `logits` [..., 2] against the soft target [1 − p, p]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(p_good * logp[..., GOOD] + (1.0 - p_good) * logp[..., BAD])


def good_probability(logits: torch.Tensor) -> torch.Tensor:
    """P(good) [...] of (bad, good) `logits` [..., 2]: a step's score."""
    return torch.softmax(logits.float(), dim=-1)[..., GOOD]


def step_correct(logits: torch.Tensor, p_good: torch.Tensor) -> torch.Tensor:
    """1.0 where the head's verdict matches the label's: good predicted when logit_good ≥ logit_bad (a tie
    predicts good, stages §3.2), against p ≥ 0.5."""
    predicted = logits[..., GOOD] >= logits[..., BAD]
    return (predicted == (p_good >= 0.5)).float()


@TERMS.register("prm", "process reward model: cross-entropy of the 2-class step head (bad, good) at each step's "
                "end, hard or soft labels", inputs={"token_scores", "step_labels"}, denominator="tokens")
def prm(inputs: LossInputs, mask: torch.Tensor):
    """`step_cross_entropy` at every position of the loss mask (the step ends of `data.steps`), on the score
    head's `token_scores` [B, T-1, 2] and `extras["step_labels"]` [B, T-1]."""
    logits, labels = inputs.extras["token_scores"], inputs.extras["step_labels"].to(torch.float32)
    loss = step_cross_entropy(logits, labels)
    steps = mask.sum().clamp(min=1)
    metrics = {"prm/loss": float((loss.detach() * mask).sum() / steps),
               "prm/step_accuracy": float((step_correct(logits.detach(), labels) * mask).sum() / steps),
               "prm/good_probability": float((good_probability(logits.detach()) * mask).sum() / steps)}
    return loss, metrics
