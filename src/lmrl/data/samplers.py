"""Prompt samplers and group filters (DAPO dynamic sampling).

A sampler has `next_prompts(n)` (the rows to roll out next), `observe(groups)` (the scored groups
of those rows, every one generated, kept or filtered: what an adaptive sampler learns from),
`state_dict()` and `load_state_dict(state)` (checkpointed with the run, so a resumed run draws
the same prompts). Its constructor takes the training rows, `seed`, optionally `accuracy_component`
(the run's), and its knobs from `data.sampler_params`. The adaptive samplers (docs/data.md) live in
`lmrl.data.adaptive`, `heapa` and `rail`."""
from __future__ import annotations

import copy
import inspect
import random
from typing import Any

import torch

from lmrl.registry import Registry
from lmrl.types import Group

SAMPLERS: Registry = Registry("sampler")
GROUP_FILTERS: Registry = Registry("group filter")


@SAMPLERS.register("uniform", "shuffled passes over the training rows, without replacement within a pass")
class UniformSampler:
    def __init__(self, rows: list[dict[str, Any]], seed: int = 0):
        if not rows:
            raise ValueError("the sampler has no rows to draw from")
        self.rows = rows
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.position = 0
        self.epoch = 0

    def next_index(self) -> int:
        """The next row of the current shuffled pass (a new pass starts when one is used up)."""
        if self.position >= len(self.order):
            self.order = list(range(len(self.rows)))
            self.rng.shuffle(self.order)
            self.position = 0
            self.epoch += 1
        self.position += 1
        return self.order[self.position - 1]

    def next_prompts(self, n: int) -> list[dict[str, Any]]:
        return [self.rows[self.next_index()] for _ in range(n)]

    def observe(self, groups: list[Group]) -> None:
        """Uniform sampling learns nothing from rewards."""

    def metrics(self) -> dict[str, float]:
        """The sampler's state for the step's log (`sampler/*`): here the pass over the rows."""
        return {"sampler/epoch": float(self.epoch)}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": list(self.order), "position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.order, self.position, self.epoch = list(state["order"]), state["position"], state["epoch"]


RUN_ARGUMENTS = ("rows", "seed", "accuracy_component")  # what the run passes; not knobs


def sampler_metrics(sampler) -> dict[str, float]:
    """The sampler's `sampler/*` metrics for the step's log; `metrics()` is optional for samplers of your own."""
    report = getattr(sampler, "metrics", None)
    return report() if report is not None else {}


def build_sampler(cfg, rows: list[dict[str, Any]]):
    """The run's sampler over `rows`: `data.sampler` with `data.sampler_params`, `trainer.seed` and, when
    its constructor asks for it, `reward.accuracy_component`. A bad knob value is a ConfigError."""
    from lmrl.config import ConfigError

    cls = SAMPLERS.get(cfg.data.sampler)
    wanted = inspect.signature(cls).parameters
    run = {"accuracy_component": cfg.reward.accuracy_component} if "accuracy_component" in wanted else {}
    try:
        return cls(rows, seed=cfg.trainer.seed, **run, **copy.deepcopy(cfg.data.sampler_params))
    except ValueError as err:
        raise ConfigError(f"data.sampler_params of sampler {cfg.data.sampler!r}: {err}") from None


@GROUP_FILTERS.register("none", "keep every group")
def keep_all(group: Group) -> bool:
    return True


@GROUP_FILTERS.register("nonzero_std", "DAPO dynamic sampling: drop groups whose rewards are all equal")
def nonzero_std(group: Group) -> bool:
    rewards = [r for r in group.rewards if r is not None]
    if len(rewards) <= 1:
        return len(rewards) == 1
    return bool(torch.tensor(rewards, dtype=torch.float).std() > 0)
