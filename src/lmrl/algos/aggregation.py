"""Loss aggregation: per-token loss and mask to a scalar.

Denominators come from `AggScale`, computed once over the whole optimisation batch, so that
splitting the batch into micro-batches and accumulating gradients gives the same update. Each
aggregation declares the one field it divides by (`AggregationSpec.denominator`): a batch that
arrives in parts is aggregated over `UNIT_SCALE` and its summed gradients divided by that field
of the parts' `combine`d scale at the end (streaming, docs/scaling.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lmrl.algos.declarations import AggregationSpec
from lmrl.registry import Registry

AGGREGATIONS: Registry = Registry("loss aggregation", declares=AggregationSpec)


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

    @staticmethod
    def combine(scales: list["AggScale"]) -> "AggScale":
        """The scale of disjoint parts taken together: counts add up, the horizon is the largest."""
        return AggScale(sum(s.num_tokens for s in scales), sum(s.num_seqs for s in scales),
                        max(s.horizon for s in scales))

    def divisor(self, field: str) -> float:
        """What an aggregation over `field` divides by (at least 1)."""
        return max(getattr(self, field), 1.0)


UNIT_SCALE = AggScale(1.0, 1.0, 1.0)  # every denominator 1: the sum of a part's terms


@AGGREGATIONS.register("token_mean", "sum of token losses / number of valid tokens in the batch",
                       denominator="num_tokens")
def token_mean(loss: torch.Tensor, mask: torch.Tensor, scale: AggScale) -> torch.Tensor:
    return (loss * mask).sum() / scale.divisor("num_tokens")


@AGGREGATIONS.register("seq_mean_token_mean", "mean over sequences of each sequence's token mean",
                       denominator="num_seqs")
def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, scale: AggScale) -> torch.Tensor:
    per_seq = (loss * mask).sum(1) / mask.sum(1).clamp(min=1)
    return per_seq.sum() / scale.divisor("num_seqs")


@AGGREGATIONS.register("seq_mean_token_sum_norm", "Dr.GRPO: sum of all token losses / constant horizon C",
                       denominator="horizon")
def seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, scale: AggScale) -> torch.Tensor:
    return (loss * mask).sum() / scale.divisor("horizon")
