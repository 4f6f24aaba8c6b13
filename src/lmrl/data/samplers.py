"""Prompt samplers and group filters (DAPO dynamic sampling).

A sampler has `next_prompts(n)` (the rows to roll out next), `observe(groups)` (the scored groups
of those rows, every one generated, kept or filtered: what an adaptive sampler learns from),
`state_dict()` and `load_state_dict(state)` (checkpointed with the run, so a resumed run draws
the same prompts)."""
from __future__ import annotations

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

    def next_prompts(self, n: int) -> list[dict[str, Any]]:
        out = []
        while len(out) < n:
            if self.position >= len(self.order):
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
                self.position = 0
                self.epoch += 1
            out.append(self.rows[self.order[self.position]])
            self.position += 1
        return out

    def observe(self, groups: list[Group]) -> None:
        """Uniform sampling learns nothing from rewards."""

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": self.order, "position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.order, self.position, self.epoch = state["order"], state["position"], state["epoch"]


@GROUP_FILTERS.register("none", "keep every group")
def keep_all(group: Group) -> bool:
    return True


@GROUP_FILTERS.register("nonzero_std", "DAPO dynamic sampling: drop groups whose rewards are all equal")
def nonzero_std(group: Group) -> bool:
    rewards = [r for r in group.rewards if r is not None]
    if len(rewards) <= 1:
        return len(rewards) == 1
    return bool(torch.tensor(rewards, dtype=torch.float).std() > 0)
