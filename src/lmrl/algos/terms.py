"""The objective as a sum of registered terms, each declaring its inputs, token weights and denominator.

A training step minimises Σ coef · term. A term is a pure function `(inputs, mask, **knobs) ->
(value, metrics)` over one micro-batch; `mask` is the loss mask (the completion mask less the tokens
the loss rejects). Its `TermSpec` says how `Algorithm.objective` normalises the value:

- "aggregation": a [B, T] per-token loss. These terms are weighted and summed per token, in their
  order, then aggregated once by `algo.aggregation` over the loss mask: the policy-gradient loss,
  KL, distillation and entropy share the method's denominator, as the methods define them.
- "tokens": a [B, T] per-token loss, / the batch's valid tokens (`token_mean`), added after.
- "sequences": a [B] per-row loss, summed, / the batch's rows, added after.

Denominators come from `AggScale` over the whole mini-batch, so micro-batching stays exact. The
policy-gradient loss is always on; `algo.kl_coef`, `algo.entropy_coef` and `algo.critic` switch on
the terms every method family shares; `algo.terms` lists any other registered term by name, with its
coefficient and knobs (`active_terms`; docs/architecture.md, "The objective as terms").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lmrl.algos.aggregation import AGGREGATIONS, AggScale, token_mean
from lmrl.algos.critic import clipped_value_loss
from lmrl.algos.declarations import TermSpec
from lmrl.algos.kl import KL_ESTIMATORS
from lmrl.algos.losses import LOSSES, LossInputs
from lmrl.algos.state import state_knobs
from lmrl.algos.teacher import DISTILL_ESTIMATORS, DISTILL_INPUTS, TEACHER_SETTINGS, build_teacher, check_teacher
from lmrl.config import AlgoConfig
from lmrl.registry import Registry

TERMS: Registry = Registry("objective term", declares=TermSpec)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of `x` over `mask` (a logged value, no gradient)."""
    return float((x.detach() * mask).sum() / mask.sum().clamp(min=1))


@TERMS.register("policy_gradient", "the configured policy loss (algo.loss) on the advantages",
                inputs={"logp", "old_logp", "advantages"}, follows_advantages=True)
def policy_gradient(inputs: LossInputs, mask: torch.Tensor, loss: str, aggregation: str, eps_low: float,
                    eps_high: float, dual_clip: float | None, loss_knobs: dict[str, Any]):
    token_loss, metrics = LOSSES.get(loss)(inputs, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip,
                                           **loss_knobs)
    metrics = dict(metrics)
    metrics["pg_loss"] = float(AGGREGATIONS.get(aggregation)(token_loss.detach(), mask, AggScale.of(mask)))
    return token_loss, metrics


@TERMS.register("kl", "KL to the reference policy per token (algo.kl_estimator)", inputs={"logp", "ref_logp"})
def kl(inputs: LossInputs, mask: torch.Tensor, estimator: str):
    value = KL_ESTIMATORS.get(estimator)(inputs.logp, inputs.ref_logp)
    return value, {"kl": masked_mean(value, mask)}


@TERMS.register("distill", "reverse KL to the policy under a privileged context, on the teacher's tokens",
                inputs={"logp", *DISTILL_INPUTS}, weights="teacher_mask", provided=DISTILL_INPUTS,
                settings=TEACHER_SETTINGS, builds=build_teacher, check=check_teacher,
                row_flags={"has_teacher": "distill/samples"})
def distill(inputs: LossInputs, mask: torch.Tensor, estimator: str = "k1"):
    """D(π ‖ π_teacher) per token (`estimator`: k1 or k3) where the teacher's mask is 1. The entry's settings
    (`context`, `context_params`, `tokens`) configure the teacher that provides those inputs (algos/teacher.py)."""
    where = inputs.extras["teacher_mask"]
    value = DISTILL_ESTIMATORS[estimator](inputs.logp, inputs.extras["teacher_logp"]) * where
    return value, ({"distill/kl": float(value.detach().sum() / where.sum())} if where.sum() > 0 else {})


@TERMS.register("entropy", "the policy's exact token entropy (a bonus: its coefficient is -algo.entropy_coef)",
                inputs={"entropy"})
def entropy(inputs: LossInputs, mask: torch.Tensor):
    return inputs.entropy, {}


@TERMS.register("demo_nll", "SGT: each demonstration row's mean negative log-likelihood",
                inputs={"logp", "demonstration"}, weights="demonstration", denominator="sequences",
                only_with_weights=True)
def demo_nll(inputs: LossInputs, mask: torch.Tensor):
    demo = (inputs.extras["demonstration"] > 0).to(inputs.logp.dtype)
    per_row = -(inputs.logp * inputs.mask).sum(1) / inputs.mask.sum(1).clamp(min=1)
    metrics = {"demo_nll": float((per_row.detach() * demo).sum() / demo.sum())} if demo.sum() > 0 else {}
    return per_row * demo, metrics


@TERMS.register("nll", "supervised next-token NLL of the loss mask's tokens, a token mean over the batch (SFT)",
                inputs={"logp"}, denominator="tokens", imitates=True)
def nll(inputs: LossInputs, mask: torch.Tensor):
    """−log p of every trained token, divided by the mini-batch's trained tokens: TRL's SFT loss, whose
    gradient accumulation divides by the tokens of all accumulated micro-batches (spec §1.1)."""
    return -inputs.logp, {"nll": masked_mean(-inputs.logp, mask)}


@TERMS.register("value", "the critic's clipped value loss against its returns",
                inputs={"values", "old_values", "returns"}, denominator="tokens")
def value(inputs: LossInputs, mask: torch.Tensor, clip: float | None):
    x = inputs.extras
    loss, clipped = clipped_value_loss(x["values"], x["old_values"], x["returns"], clip)
    return loss, {"critic/value_loss": masked_mean(loss, mask), "critic/clip_frac": masked_mean(clipped, mask)}


@dataclass(frozen=True)
class ActiveTerm:
    name: str
    coef: float
    knobs: dict[str, Any] = field(default_factory=dict)  # passed to the term's function
    settings: dict[str, Any] = field(default_factory=dict)  # for what provides its inputs (`TermSpec.settings`)


def listed_term(name: str, coef: float, params: dict[str, Any]) -> ActiveTerm:
    """An `algo.terms` entry: its params split into the function's knobs and the declared settings."""
    spec = TERMS.spec(name)
    knobs = {k: v for k, v in params.items() if k not in spec.settings}
    return ActiveTerm(name, coef, knobs, {**spec.settings, **{k: v for k, v in params.items() if k in spec.settings}})


def active_terms(cfg: AlgoConfig, policy_gradient: bool = True) -> list[ActiveTerm]:
    """The terms of the objective, in the order they are summed: the policy-gradient loss, the shared terms
    their keys switch on, then the entries of `algo.terms` (one with coefficient 0 is off).

    A batch trained by its listed terms alone (`policy_gradient=False`: an offline dataset's rows, preference
    pairs) has no policy-gradient or value term, only KL, entropy and the listed terms."""
    listed = [listed_term(t.name, t.coef, t.params) for t in cfg.terms if t.coef != 0]
    shared = []
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        shared.append(ActiveTerm("kl", cfg.kl_coef, {"estimator": cfg.kl_estimator}))
    if cfg.entropy_coef != 0:
        shared.append(ActiveTerm("entropy", -cfg.entropy_coef))
    if not policy_gradient:
        return shared + listed
    spec = LOSSES.spec(cfg.loss)
    loss_knobs = {k: v for k, v in cfg.loss_params.items() if k not in state_knobs(spec)}
    terms = [ActiveTerm("policy_gradient", 1.0, {
        "loss": cfg.loss, "aggregation": cfg.aggregation, "eps_low": cfg.eps_low, "eps_high": cfg.eps_high,
        "dual_clip": cfg.dual_clip, "loss_knobs": loss_knobs}), *shared]
    if cfg.critic:
        terms.append(ActiveTerm("value", cfg.value_coef, {"clip": cfg.value_clip}))
    return terms + listed


# the config key that switches each shared term on: `algo.terms` may not add them again
KEYED_TERMS = {"policy_gradient": "algo.loss", "kl": "algo.kl_coef", "entropy": "algo.entropy_coef",
               "value": "algo.critic"}


def term_inputs(terms: list[ActiveTerm]) -> set[str]:
    """Everything the given terms read (what the learner must put into `LossInputs`)."""
    return set().union(*(TERMS.spec(t.name).inputs for t in terms))


def compose(terms: list[ActiveTerm], inputs: LossInputs, mask: torch.Tensor, scale: AggScale,
            aggregation: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ coef · term of one micro-batch: per-token terms summed then aggregated once, then the others."""
    metrics: dict[str, float] = {}
    token_loss, after = None, []
    for term in terms:
        spec = TERMS.spec(term.name)
        if spec.only_with_weights and spec.weights not in inputs.extras:
            continue
        value, logged = TERMS.get(term.name)(inputs, mask, **term.knobs)
        metrics.update(logged)
        if spec.denominator == "aggregation":
            token_loss = term.coef * value if token_loss is None else token_loss + term.coef * value
        else:
            after.append((spec.denominator, term.coef, value))
    total = AGGREGATIONS.get(aggregation)(token_loss, mask, scale) if token_loss is not None else mask.new_zeros(())
    for denominator, coef, value in after:
        if denominator == "sequences":
            total = total + coef * value.sum() / scale.divisor("num_seqs")
        else:
            total = total + coef * token_mean(value, mask, scale)
    return total, metrics
