"""Input providers: where each per-sample input an algorithm declares comes from.

An estimator or loss declares the inputs it needs (`requires` in its registry declaration). A
provider is registered under a name with the input names it fills (`provides`, by default its own
name) and the fields of `InputContext` it reads (`needs`: the learner, the tokenizer, the task
rows, …). The loop asks for the inputs the algorithm declares (`lmrl.loops.providers`): providers
that need no learner run when the batch is assembled, those that need it just before
`Algorithm.prepare`, in registration order. An `always` provider fills every batch, declared or
not: its inputs are cheap, and estimators may read them as optional keyword inputs.

This module holds the registry and the providers computed from the samples alone; those that run
the model are in `lmrl.learners.inputs`. docs/architecture.md shows where they sit in the loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import torch

from lmrl.algos.multi_reward import modality_mask
from lmrl.algos.inputs import ROW_FIELD_INPUTS
from lmrl.registry import Registry
from lmrl.types import Batch, Group, Sample


@dataclass
class InputContext:
    """What providers may read while one batch is built; each provider declares the fields it needs."""

    cfg: Any  # the run's Config
    groups: list[Group]  # the groups that enter the update, in batch order
    requested: frozenset[str] = frozenset()  # the input names the algorithm declares
    step: int | None = None
    learner: Any = None
    tokenizer: Any = None
    algorithm: Any = None

    @cached_property
    def samples(self) -> list[Sample]:
        """The batch's samples: each group's scored samples, in batch order."""
        return [x for g in self.groups for x in g.scored]

    @cached_property
    def rows(self) -> list[dict]:
        """The task row of each batch row."""
        return [g.row for g in self.groups for _ in g.scored]


CONTEXT_FIELDS = frozenset({"cfg", "groups", "requested", "step", "learner", "tokenizer", "algorithm", "samples",
                            "rows"})


@dataclass(frozen=True)
class ProviderSpec:
    provides: frozenset[str] = frozenset()  # input names it fills (and the views `algos.inputs.lookup` derives)
    needs: frozenset[str] = frozenset()  # InputContext fields it reads; with "learner" it runs on the assembled batch
    always: bool = False  # fills every batch, whether or not the algorithm declares its inputs

    def __post_init__(self):
        object.__setattr__(self, "provides", frozenset(self.provides))
        object.__setattr__(self, "needs", frozenset(self.needs))
        unknown = sorted(self.needs - CONTEXT_FIELDS)
        if unknown:
            raise TypeError(f"a provider needs InputContext fields; {unknown} are not among {sorted(CONTEXT_FIELDS)}")


Provider = Callable[[Batch, InputContext], None]


class ProviderRegistry(Registry):
    """Providers by name. `provides` defaults to the name; `in_order` is the registration order, so a
    provider may read what an earlier one filled."""

    def __init__(self):
        super().__init__("input provider", declares=ProviderSpec)

    def register(self, name: str, description: str | None = None, **declaration: Any) -> Callable[[Provider], Provider]:
        return super().register(name, description, **{"provides": {name}, **declaration})

    def in_order(self) -> list[str]:
        return list(self._items)


PROVIDERS = ProviderRegistry()


@PROVIDERS.register("step", "the training step and the run's total steps (batch context)",
                    provides={"step", "total_steps"}, needs={"cfg", "step"}, always=True)
def training_step(batch: Batch, ctx: InputContext) -> None:
    batch.context.update(step=ctx.step, total_steps=ctx.cfg.trainer.steps)


@PROVIDERS.register("accuracy", "per-sample correctness (reward.accuracy_component >= 1) and its prompt's mean",
                    provides={"acc", "group_acc"}, needs={"cfg", "groups"}, always=True)
def accuracy(batch: Batch, ctx: InputContext) -> None:
    name = ctx.cfg.reward.accuracy_component
    acc, group_acc = [], []
    for group in ctx.groups:
        correct = [float(x.rewards.get(name, 0.0) >= 1.0) for x in group.scored]
        for c in correct:
            acc.append(c)
            group_acc.append(sum(correct) / len(correct))
    batch.extras.update(acc=torch.tensor(acc), group_acc=torch.tensor(group_acc))


@PROVIDERS.register("reward_components", "each reward component's score [B, K] in the order of reward.components "
                    "(NaN where one gave none); `acoustic_rewards` is one of its columns",
                    provides={"reward_components", "acoustic_rewards"}, needs={"cfg", "samples"}, always=True)
def reward_components(batch: Batch, ctx: InputContext) -> None:
    names = [c.name for c in ctx.cfg.reward.components]
    if not names:
        return
    batch.row_extras["reward_components"] = torch.tensor(
        [[float("nan") if x.rewards.get(n) is None else float(x.rewards[n]) for n in names] for x in ctx.samples])
    batch.context["reward_component_names"] = names


def row_field_tensor(values: list, name: str) -> torch.Tensor:
    """A task row field as a tensor: numbers give [B], lists give [B, P] padded with NaN (absent entries)."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.float if any(isinstance(v, float) for v in values) else torch.long)
    if all(isinstance(v, (list, tuple)) for v in values):
        out = torch.full((len(values), max((len(v) for v in values), default=0)), float("nan"))
        for i, v in enumerate(values):
            out[i, : len(v)] = torch.tensor([float("nan") if e is None else float(e) for e in v])
        return out
    raise ValueError(f"task field {name!r} must be a number or a list of numbers in every row")


@PROVIDERS.register("row_fields", "the declared task row fields, each sample carrying its prompt's value",
                    provides=ROW_FIELD_INPUTS, needs={"rows", "requested"})
def row_fields(batch: Batch, ctx: InputContext) -> None:
    for name in sorted(ctx.requested & ROW_FIELD_INPUTS):
        batch.row_extras[name] = row_field_tensor([r[name] for r in ctx.rows], name)


@PROVIDERS.register("origin", "where each row came from (`types.Origin`): `demonstration` 1.0 where the policy "
                    "did not sample it, `in_advantage` False where it stays out of the advantage estimate; each "
                    "only when some row needs it", provides={"demonstration", "in_advantage"}, needs={"samples"},
                    always=True)
def origin_flags(batch: Batch, ctx: InputContext) -> None:
    origins = [x.origin for x in ctx.samples]
    if not all(o.sampled for o in origins):
        batch.row_extras["demonstration"] = torch.tensor([0.0 if o.sampled else 1.0 for o in origins])
    if not all(o.in_advantage for o in origins):
        batch.row_extras["in_advantage"] = torch.tensor([o.in_advantage for o in origins])


@PROVIDERS.register("speech_mask", "the generated tokens whose id lies in the knob speech_id_range [start, end) "
                    "of algo.advantage_params", needs={"cfg"})
def speech_mask(batch: Batch, ctx: InputContext) -> None:
    knobs = ctx.cfg.algo.advantage_params
    if "speech_id_range" in knobs:
        speech = modality_mask(batch.input_ids[:, 1:], knobs["speech_id_range"])
        batch.extras["speech_mask"] = speech * batch.completion_mask
