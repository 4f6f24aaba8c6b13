"""Loss aggregation: per-token loss and mask to a scalar.

Denominators come from `AggScale`, computed once over the whole optimisation batch, so that
splitting the batch into micro-batches and accumulating gradients gives the same update.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lmrl.registry import Registry

AGGREGATIONS: Registry = Registry("loss aggregation")


@dataclass(frozen=True)
class AggScale:
    """Batch-level denominators: valid tokens, sequences, and the constant horizon C."""

    num_tokens: float
    num_seqs: float
    horizon: float

    @staticmethod
    def of(mask: torch.Tensor, horizon: float | None = None) -> "AggScale":
        seqs = float((mask.sum(1) > 0).sum().item())
        return AggScale(float(mask.sum().item()), seqs, float(horizon or mask.shape[1]))


@AGGREGATIONS.register("token_mean", "sum of token losses / number of valid tokens in the batch")
def token_mean(loss: torch.Tensor, mask: torch.Tensor, scale: AggScale) -> torch.Tensor:
    return (loss * mask).sum() / max(scale.num_tokens, 1.0)


@AGGREGATIONS.register("seq_mean_token_mean", "mean over sequences of each sequence's token mean")
def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, scale: AggScale) -> torch.Tensor:
    per_seq = (loss * mask).sum(1) / mask.sum(1).clamp(min=1)
    return per_seq.sum() / max(scale.num_seqs, 1.0)


@AGGREGATIONS.register("seq_mean_token_sum_norm", "Dr.GRPO: sum of all token losses / constant horizon C")
def seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, scale: AggScale) -> torch.Tensor:
    return (loss * mask).sum() / scale.horizon
