"""Objective terms for preference pairs, unpaired labels and reward-model training: dpo, dpo_reference_free,
simpo, orpo, kto, bradley_terry.

Each term reads a micro-batch's rows, gathers a pair's chosen and rejected rows (`extras["pair"]`,
`extras["chosen"]`), applies a loss of `algos/preference_losses.py` per pair, and puts each pair's loss
on both of its rows. Declared with `denominator="sequences"`, the objective divides the rows' sum by
the mini-batch's row count: the mean over pairs, exactly, however the pairs are split into
micro-batches (`pairwise=True` keeps a pair's two rows together). Sequence log-probs are sums over the
loss mask. Formulas and knobs: docs/methods/preference.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lmrl.algos.losses import LossInputs
from lmrl.algos.preference_losses import (bradley_terry_loss, dpo_loss, dpo_problem, kto_loss, orpo_loss,
                                          pairwise_accuracy, simpo_loss)
from lmrl.algos.terms import TERMS

PAIR_INPUTS = frozenset({"chosen", "pair"})


@dataclass(frozen=True)
class Pairs:
    """Where each pair's rows sit in a micro-batch: pairs numbered 0..P-1 in the order of their ids."""

    of_row: torch.Tensor  # [B] each row's pair number
    chosen_row: torch.Tensor  # [P] the row of each pair's chosen completion
    rejected_row: torch.Tensor  # [P] and of its rejected one

    @staticmethod
    def of(extras: dict[str, torch.Tensor]) -> "Pairs":
        """The pairs of `extras["pair"]` [B] (ids) and `extras["chosen"]` [B] (1.0 chosen, 0.0 rejected); a pair
        that has not exactly one chosen and one rejected row in the micro-batch is refused."""
        ids, of_row = torch.unique(extras["pair"], return_inverse=True)
        chosen = extras["chosen"] > 0.5
        rows = torch.bincount(of_row, minlength=ids.numel())
        chosen_count = torch.bincount(of_row[chosen], minlength=ids.numel())
        if not (bool((rows == 2).all()) and bool((chosen_count == 1).all())):
            raise ValueError("each preference pair needs exactly one chosen and one rejected row in its "
                             f"micro-batch; pair ids {ids.tolist()} have {rows.tolist()} rows, "
                             f"{chosen_count.tolist()} chosen")
        positions = torch.arange(of_row.numel(), device=of_row.device)
        chosen_row = torch.empty_like(ids).scatter_(0, of_row[chosen], positions[chosen])
        rejected_row = torch.empty_like(ids).scatter_(0, of_row[~chosen], positions[~chosen])
        return Pairs(of_row, chosen_row, rejected_row)

    def split(self, per_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A [B] per-row value as its chosen and rejected [P] values."""
        return per_row[self.chosen_row], per_row[self.rejected_row]

    def on_rows(self, per_pair: torch.Tensor) -> torch.Tensor:
        """A [P] per-pair value on both rows of each pair [B]."""
        return per_pair[self.of_row]


def sequence_logp(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_t logp over each row's loss mask [B]."""
    return (logp * mask).sum(1)


def lengths(mask: torch.Tensor) -> torch.Tensor:
    """Each row's number of completion tokens [B]."""
    return mask.sum(1)


def average_logp(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's mean completion log-prob ā [B] (0 for a row without completion tokens)."""
    return sequence_logp(logp, mask) / lengths(mask).clamp(min=1)


def pair_metrics(loss: torch.Tensor, chosen_reward: torch.Tensor, rejected_reward: torch.Tensor) -> dict[str, float]:
    """What every pairwise preference term logs: loss, reward accuracy and margin, the two rewards."""
    return {"pref/loss": float(loss.detach().mean()),
            "pref/reward_accuracy": float(pairwise_accuracy(chosen_reward, rejected_reward)),
            "pref/margin": float((chosen_reward - rejected_reward).mean()),
            "pref/chosen_reward": float(chosen_reward.mean()),
            "pref/rejected_reward": float(rejected_reward.mean())}


def check_dpo(cfg, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0, **_) -> str | None:
    return dpo_problem(beta, loss_type, label_smoothing)


def dpo_on_rows(h: torch.Tensor, inputs: LossInputs, mask: torch.Tensor, beta: float, loss_type: str,
                label_smoothing: float, ipo_length_norm: bool) -> tuple[torch.Tensor, dict[str, float]]:
    pairs = Pairs.of(inputs.extras)
    (h_w, h_l), (len_w, len_l) = pairs.split(h), pairs.split(lengths(mask))
    loss, chosen_reward, rejected_reward = dpo_loss(h_w, h_l, beta, loss_type, label_smoothing, len_w, len_l,
                                                    ipo_length_norm)
    return pairs.on_rows(loss), pair_metrics(loss, chosen_reward, rejected_reward)


@TERMS.register("dpo", "DPO on preference pairs against the frozen reference (loss_type: sigmoid, cdpo, robust, "
                "ipo, hinge)", inputs={"logp", "ref_logp", *PAIR_INPUTS}, denominator="sequences", pairwise=True,
                check=check_dpo)
def dpo(inputs: LossInputs, mask: torch.Tensor, beta: float = 0.1, loss_type: str = "sigmoid",
        label_smoothing: float = 0.0, ipo_length_norm: bool = True):
    """`dpo_loss` with h = Σ (logπ − logπ_ref) over each completion; each pair's loss on both its rows."""
    h = sequence_logp(inputs.logp - inputs.ref_logp, mask)
    return dpo_on_rows(h, inputs, mask, beta, loss_type, label_smoothing, ipo_length_norm)


@TERMS.register("dpo_reference_free", "DPO without a reference model: h = logπ(y) (loss_type as dpo)",
                inputs={"logp", *PAIR_INPUTS}, denominator="sequences", pairwise=True, check=check_dpo)
def dpo_reference_free(inputs: LossInputs, mask: torch.Tensor, beta: float = 0.1, loss_type: str = "sigmoid",
                       label_smoothing: float = 0.0, ipo_length_norm: bool = True):
    """`dpo_loss` with the reference's log-probs taken as 0; no reference model is kept."""
    return dpo_on_rows(sequence_logp(inputs.logp, mask), inputs, mask, beta, loss_type, label_smoothing,
                       ipo_length_norm)


@TERMS.register("simpo", "SimPO: reference-free, on average log-probs with a target margin γ",
                inputs={"logp", *PAIR_INPUTS}, denominator="sequences", pairwise=True)
def simpo(inputs: LossInputs, mask: torch.Tensor, beta: float = 0.1, gamma: float = 0.5,
          label_smoothing: float = 0.0):
    pairs = Pairs.of(inputs.extras)
    loss, chosen_reward, rejected_reward = simpo_loss(*pairs.split(average_logp(inputs.logp, mask)), beta, gamma,
                                                      label_smoothing)
    return pairs.on_rows(loss), pair_metrics(loss, chosen_reward, rejected_reward)


@TERMS.register("orpo", "ORPO: the chosen completion's NLL plus λ times the odds-ratio loss (no reference)",
                inputs={"logp", *PAIR_INPUTS}, denominator="sequences", pairwise=True)
def orpo(inputs: LossInputs, mask: torch.Tensor, lam: float = 0.1):
    """`orpo_loss`, the NLL being the chosen row's token mean; rewards logged as λ·ā, as TRL does."""
    pairs = Pairs.of(inputs.extras)
    avg_w, avg_l = pairs.split(average_logp(inputs.logp, mask))
    loss, log_odds_ratio = orpo_loss(avg_w, avg_l, -avg_w, lam)
    metrics = pair_metrics(loss, lam * avg_w.detach(), lam * avg_l.detach())
    metrics.update({"pref/nll": float(-avg_w.detach().mean()),
                    "pref/log_odds_ratio": float(log_odds_ratio.detach().mean())})
    return pairs.on_rows(loss).to(inputs.logp.dtype), metrics


def check_kto(cfg, **_) -> str | None:
    """KTO's reference point pairs each prompt with another row's completion: a batch needs two rows."""
    return "needs batches.size >= 2: its reference point pairs each prompt with another row's completion" \
        if cfg.batches.size < 2 else None


@TERMS.register("kto", "KTO: unpaired desirable/undesirable completions against the batch's KL reference point",
                inputs={"logp", "ref_logp", "desirable", "kto_z0"}, denominator="sequences", check=check_kto)
def kto(inputs: LossInputs, mask: torch.Tensor, beta: float = 0.1, desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0):
    """`kto_loss` per row; `extras["kto_z0"]` is z₀ of the whole batch (`kto_reference_point`), a 0-d tensor."""
    desirable = inputs.extras["desirable"] > 0.5
    h = sequence_logp(inputs.logp - inputs.ref_logp, mask)
    loss, reward = kto_loss(h, inputs.extras["desirable"], inputs.extras["kto_z0"], beta, desirable_weight,
                            undesirable_weight)
    metrics = {"pref/loss": float(loss.detach().mean()), "pref/kl_reference": float(inputs.extras["kto_z0"])}
    if desirable.any():
        metrics["pref/chosen_reward"] = float(reward[desirable].mean())
    if (~desirable).any():
        metrics["pref/rejected_reward"] = float(reward[~desirable].mean())
    return loss, metrics


@TERMS.register("bradley_terry", "Bradley–Terry reward-model loss on the pair's scores (+ margin, + centering)",
                inputs={"score", *PAIR_INPUTS}, denominator="sequences", pairwise=True)
def bradley_terry(inputs: LossInputs, mask: torch.Tensor, center_coef: float | None = None):
    """`bradley_terry_loss` on `extras["score"]` [B] (the reward model's scalar at each row's last token); a
    per-pair `extras["margin"]`, when the batch has one, is read on the chosen row."""
    pairs = Pairs.of(inputs.extras)
    r_w, r_l = pairs.split(inputs.extras["score"])
    margin = inputs.extras["margin"][pairs.chosen_row] if "margin" in inputs.extras else None
    loss = bradley_terry_loss(r_w, r_l, margin, center_coef)
    metrics = {"rm/loss": float(loss.detach().mean()), "rm/accuracy": float(pairwise_accuracy(r_w, r_l)),
               "rm/margin": float((r_w - r_l).detach().mean())}
    return pairs.on_rows(loss), metrics
