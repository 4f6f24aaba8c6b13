"""RAIL: choosing an intervention per prompt slot with a contextual bandit (docs/data.md).

The spec's RAIL is a rollout controller (arms: none, resample from prefix k, branch, hint). A sampler
can carry out the prompt-level arms: `none` (the next row of the shuffled pass), `retry` (roll out
again a prompt whose last group had no learning signal: a resample from prefix 0) and `revisit`
(roll out again one whose last group had signal). Arms that act inside a rollout need a rollout
controller in the loop: they are the `rail` controller's (`lmrl.envs.rail_rollout`, which holds the bandit).
"""
from __future__ import annotations

import copy
import math
from typing import Any

from lmrl.data.prompt_stats import PromptStats, base_uid
from lmrl.data.samplers import SAMPLERS, UniformSampler
from lmrl.envs.rail_rollout import LinearBandit
from lmrl.types import Group

ARMS = ("none", "retry", "revisit")


@SAMPLERS.register("rail", "RAIL: a contextual bandit picks per slot a fresh prompt, a retry or a revisit")
class RailSampler(UniformSampler):
    """RAIL (confidence low: a reconstruction from the abstract, at the prompt level).

    Each slot of a batch is one bandit decision among the arms available (`retry` needs a prompt whose
    last group's metric was constant, `revisit` one whose last group's varied). Context: [1, recent
    mean metric, recent share of groups without signal] (exponential averages). Bandit reward: the
    group's learning signal (standard deviation of its metric) minus the no-intervention estimate
    (the mean signal of the `none` groups so far). Shadow-to-live: until the policy version reaches
    `shadow_steps` every slot is `none` (uniform) and each draw is credited to the arm it amounts to
    (a seen prompt drawn again is a retry or a revisit), so the bandit learns from the logged trace
    before it chooses live.
    """

    EMA = 0.9  # weight of the past in the context's running averages

    def __init__(self, rows: list[dict[str, Any]], seed: int = 0, accuracy_component: str = "answer",
                 policy: str = "linucb", alpha: float = 0.5, ridge: float = 1.0, shadow_steps: int = 2,
                 metric: str = "reward"):
        super().__init__(rows, seed)
        if shadow_steps < 0:
            raise ValueError(f"shadow_steps must be ≥ 0 (got {shadow_steps})")
        self.bandit = LinearBandit(len(ARMS), 3, policy, alpha, ridge, seed)
        self.stats = PromptStats(metric, accuracy_component)
        self.shadow_steps = shadow_steps
        self.index = {str(r["uid"]): i for i, r in enumerate(rows)}
        self.signal: dict[int, float] = {}  # row -> learning signal of its last group
        self.context = [1.0, 0.0, 0.0]
        self.baseline = [0.0, 0]  # sum and count of the `none` groups' signals
        self.pending: dict[int, list[tuple[int, list[float]]]] = {}  # row -> (arm, context) per draw
        self.arms_drawn = [0] * len(ARMS)  # slots of the last batch per arm

    def arm_rows(self, arm: int, taken: set[int]) -> list[int]:
        """The rows arm `arm` may draw now (for retry/revisit: seen rows of its kind not yet in the batch)."""
        flat = arm == ARMS.index("retry")
        return sorted(i for i, s in self.signal.items() if (s == 0) == flat and i not in taken)

    def next_prompts(self, n: int) -> list[dict[str, Any]]:
        live = self.stats.clock >= self.shadow_steps
        chosen: list[int] = []
        self.arms_drawn = [0] * len(ARMS)
        for _ in range(n):
            if live:
                allowed = [a for a in range(len(ARMS)) if a == 0 or self.arm_rows(a, set(chosen))]
                arm = self.bandit.choose(self.context, allowed)
                i = self.next_index() if arm == 0 else self.rng.choice(self.arm_rows(arm, set(chosen)))
            else:
                i = self.next_index()
                arm = 0 if i not in self.signal else ARMS.index("retry" if self.signal[i] == 0 else "revisit")
            self.pending.setdefault(i, []).append((arm, list(self.context)))
            self.arms_drawn[arm] += 1
            chosen.append(i)
        return [self.rows[i] for i in chosen]

    def observe(self, groups: list[Group]) -> None:
        self.stats.observe(groups)
        for group in groups:
            i = self.index.get(base_uid(group))
            values = self.stats.group_values(group)
            if i is None or not values:
                continue
            mean = sum(values) / len(values)
            signal = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            self.signal[i] = signal
            if self.pending.get(i):
                arm, x = self.pending[i].pop(0)
                if not self.pending[i]:
                    del self.pending[i]
                baseline = self.baseline[0] / self.baseline[1] if self.baseline[1] else 0.0
                self.bandit.update(arm, x, signal - baseline)
                if arm == 0:
                    self.baseline = [self.baseline[0] + signal, self.baseline[1] + 1]
            e = self.EMA
            self.context = [1.0, e * self.context[1] + (1 - e) * mean, e * self.context[2] + (1 - e) * (signal == 0)]

    def metrics(self) -> dict[str, float]:
        """Each arm's share of the last batch, the no-intervention baseline signal and the history's summary."""
        slots = max(sum(self.arms_drawn), 1)
        baseline = self.baseline[0] / self.baseline[1] if self.baseline[1] else 0.0
        return {**super().metrics(), **{f"sampler/arm_{a}": c / slots for a, c in zip(ARMS, self.arms_drawn)},
                "sampler/baseline_signal": baseline, **self.stats.summary(len(self.rows))}

    def state_dict(self) -> dict[str, Any]:
        own = copy.deepcopy({"signal": self.signal, "context": self.context, "baseline": self.baseline,
                             "pending": self.pending})
        return {**super().state_dict(), **own, "bandit": self.bandit.state_dict(), "stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        own = copy.deepcopy(state)
        self.signal, self.context, self.baseline = own["signal"], own["context"], own["baseline"]
        self.pending = own["pending"]
        self.bandit.load_state_dict(state["bandit"])
        self.stats.load_state_dict(state["stats"])
