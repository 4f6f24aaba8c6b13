"""Reward and advantage transforms applied in order by `Algorithm.prepare`, each declaring its stage and inputs.

A shaper is a pure function `(value, inputs, **knobs) -> (value, metrics)`: it rewrites the value of
its `ShaperSpec.stage` and reads only the `inputs` it declares, handed over by name in `inputs`:

- "rewards": the [B] sequence rewards, before they are placed on each row's last token;
- "token_rewards": the [B, T] token rewards, before the estimator;
- "advantages": the [B, T] advantages, after the estimator (and the critic's targets).

Stages run in that order; within a stage, in `active_shapers` order: KL in the reward when
`algo.kl_in_reward` folds the KL there, then the entries of `algo.shaping`, each a registered shaper
by name with its knobs (docs/architecture.md, "Shapers").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lmrl.algos.cost_aware import cost_aware_weights
from lmrl.algos.declarations import ShaperSpec
from lmrl.algos.kl import k1
from lmrl.config import AlgoConfig
from lmrl.registry import Registry
from lmrl.stats import overlong_penalty

SHAPERS: Registry = Registry("shaper", declares=ShaperSpec)

# what a shaper may declare beyond batch `extras` names: mask = the completion mask [B, T],
# behaviour_logp = the sampling policy's log-probs [B, T], max_new_tokens = the rollout's length limit,
# group_index = each row's prompt group [B]
SHAPER_INPUTS = frozenset({"mask", "behaviour_logp", "max_new_tokens", "group_index"})


def _buffer_fits(cfg, buffer: int, factor: float = 1.0) -> str | None:
    """The buffer is counted back from the token limit, so it must fit under it."""
    limit = cfg.rollout.max_new_tokens
    return f"buffer={buffer} must be smaller than rollout.max_new_tokens={limit}" if buffer >= limit else None


@SHAPERS.register("overlong", "DAPO soft overlong punishment added to the sequence reward",
                  stage="rewards", inputs={"mask", "max_new_tokens"}, check=_buffer_fits)
def overlong(rewards: torch.Tensor, inputs: dict[str, Any], buffer: int, factor: float = 1.0):
    penalty = overlong_penalty(inputs["mask"].sum(1), inputs["max_new_tokens"], buffer, factor)
    return rewards + penalty, {"overlong_penalty": float(penalty.mean())}


@SHAPERS.register("kl_in_reward", "β · k1(π_behaviour, π_ref) subtracted from each token's reward",
                  stage="token_rewards", inputs={"mask", "behaviour_logp", "ref_logp"})
def kl_in_reward(token_rewards: torch.Tensor, inputs: dict[str, Any], coef: float):
    mask = inputs["mask"]
    kl = k1(inputs["behaviour_logp"], inputs["ref_logp"]) * mask
    return token_rewards - coef * kl, {"kl_in_reward": float(kl.sum() / mask.sum().clamp(min=1))}


@SHAPERS.register("cost_aware", "Cost-Aware GRPO: keep rows drawn by |A_i|/√L_i, A_i ← w_i·A_i (unbiased)",
                  stage="advantages", inputs={"mask"}, whole_batch=True)
def cost_aware(advantages: torch.Tensor, inputs: dict[str, Any], fraction: float):
    """A_i is the row's mean advantage over its tokens; draws = round(fraction · rows), with replacement,
    from torch's global generator (checkpointed, so resume is exact); the rest become inert. Denominators
    stay those of the whole batch (docs/methods/cost_aware_grpo.md)."""
    mask = inputs["mask"]
    lengths = mask.sum(1)
    per_row = (advantages * mask).sum(1) / lengths.clamp(min=1)
    draws = max(1, round(fraction * advantages.shape[0]))
    selected, weights = cost_aware_weights(per_row, lengths, draws)
    return advantages * weights.unsqueeze(1), {
        "cost_aware/selected_frac": float(selected.float().mean()),
        "cost_aware/token_frac": float(lengths[selected].sum() / lengths.sum().clamp(min=1))}


@dataclass(frozen=True)
class ActiveShaper:
    name: str
    knobs: dict[str, Any] = field(default_factory=dict)


def active_shapers(cfg: AlgoConfig) -> list[ActiveShaper]:
    """The shapers of this config, each stage's applied in this order: KL in the reward when
    `algo.kl_in_reward` folds the KL there, then `algo.shaping`."""
    shapers = [ActiveShaper("kl_in_reward", {"coef": cfg.kl_coef})] if cfg.kl_in_reward else []
    return shapers + [ActiveShaper(s.name, dict(s.params)) for s in cfg.shaping]


# the config key that switches each keyed shaper on: `algo.shaping` may not add them again
KEYED_SHAPERS = {"kl_in_reward": "algo.kl_in_reward"}


def shaper_inputs(shapers: list[ActiveShaper]) -> set[str]:
    """Everything the given shapers read."""
    return set().union(*(SHAPERS.spec(s.name).inputs for s in shapers))


def apply_shapers(shapers: list[ActiveShaper], stage: str, value: torch.Tensor,
                  inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
    """`value` through the given shapers of `stage`, in order, and what they log."""
    metrics: dict[str, float] = {}
    for shaper in shapers:
        spec = SHAPERS.spec(shaper.name)
        if spec.stage != stage:
            continue
        missing = spec.inputs - inputs.keys()
        if missing:
            raise KeyError(f"shaper {shaper.name!r} reads {sorted(missing)}, which this batch does not have")
        value, logged = SHAPERS.get(shaper.name)(value, {k: inputs[k] for k in spec.inputs}, **shaper.knobs)
        metrics.update(logged)
    return value, metrics
