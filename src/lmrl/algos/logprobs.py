"""Per-token log-probabilities (and entropy) of chosen tokens under logits: the one conversion the
learner and any scorer that runs the policy's model share."""
from __future__ import annotations

import torch


def selected_logprobs(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """Log-prob of `targets` under `logits` ([..., V]) and optionally the entropy, in float32."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy
