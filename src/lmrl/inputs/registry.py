"""The provider registry: where each per-sample input an algorithm declares comes from, and how the loop asks.

A provider is a function `(batch, ctx: InputContext) -> None` registered under a name with the input
names it fills (`provides`, by default its own name; no name has two providers) and the fields of
`InputContext` it reads (`needs`: the learner, the tokenizer, the task rows, …). Everything a
provider uses of the run reaches it through the context, so this package imports no learner or
loop. The loop asks for the inputs the algorithm declares (`requested_inputs`) and `provide` runs
the providers of those names and those that fill every batch (`always`: cheap inputs that
estimators may read as optional keyword inputs): the ones that need no learner when the batch is
assembled, the others just before `Algorithm.prepare`, each in registration order.
docs/architecture.md shows where they sit in the loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

from lmrl.inputs.vocabulary import ALIASES, STEP_FIELDS, canonical
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
    provides: frozenset[str] = frozenset()  # input names it fills
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
    """Providers by name. `provides` defaults to the name, and an input name another provider already
    fills is refused; `in_order` is the registration order, so a provider may read what an earlier
    one filled."""

    def __init__(self):
        super().__init__("input provider", declares=ProviderSpec)

    def register(self, name: str, description: str | None = None, **declaration: Any) -> Callable[[Provider], Provider]:
        declaration = {"provides": {name}, **declaration}
        add = super().register(name, description, **declaration)
        provides = frozenset(declaration["provides"])

        def checked(fn: Provider) -> Provider:
            taken = {n: other for other, spec in self._specs.items() if other != name for n in spec.provides & provides}
            if taken:
                raise ValueError(f"input provider {name!r} would fill {sorted(taken)}, which "
                                 f"{sorted(set(taken.values()))} already provide; an input has one provider")
            return add(fn)

        return checked

    def in_order(self) -> list[str]:
        return list(self._items)


PROVIDERS = ProviderRegistry()


def provided_inputs() -> set[str]:
    """Every per-sample input name some provider can fill (with the estimators' aliases of them)."""
    names = {name for spec in PROVIDERS.specs().values() for name in spec.provides}
    return names | {alias for alias, target in ALIASES.items() if target in names}


def requested_inputs(algorithm) -> frozenset[str]:
    """The inputs the algorithm declares: its estimator's and loss's (aliases and the providers' names
    both), the reference policy's log-probs when it needs them, the model outputs it reads before
    `prepare`, and what its terms and shapers read beyond the step's own fields."""
    reference = {"ref_logp"} if algorithm.needs_reference else set()
    objective = (algorithm.term_inputs | algorithm.shaper_inputs) - STEP_FIELDS
    declared = set(algorithm.requires) | objective
    return frozenset(declared | canonical(declared) | reference | algorithm.prepare_outputs)


def provide(batch: Batch, ctx: InputContext, with_learner: bool) -> None:
    """Run, in registration order, the providers of the requested inputs and those that always fill:
    with `with_learner`, the ones that need the learner, otherwise the others. A requested alias then
    names the value of the input it stands for."""
    for name in PROVIDERS.in_order():
        spec = PROVIDERS.spec(name)
        if ("learner" in spec.needs) != with_learner or not (spec.always or spec.provides & ctx.requested):
            continue
        missing = sorted(n for n in spec.needs if getattr(ctx, n) is None)
        if missing:
            raise ValueError(f"input provider {name!r} needs {missing}, which the loop did not give it")
        PROVIDERS.get(name)(batch, ctx)
    for alias in sorted(ctx.requested & ALIASES.keys()):
        for store in (batch.context, batch.row_extras, batch.extras):
            if ALIASES[alias] in store:
                store[alias] = store[ALIASES[alias]]
