"""RAIL's in-rollout interventions: a contextual bandit chooses, per prompt, how its group is rolled out (specs
rewards_data_systems §2.4; docs/methods/rail_interventions.md) — confidence: low, reconstructed from the abstract.

Arms (`arms`, a subset of):
- `none`: n fresh completions;
- `resample`: n continuations of the first `prefix_share` of the tokens of the prompt's lowest-rewarded completion
  in its last group (a resample from prefix k). The prefix was sampled by an earlier policy: it is the
  completions' context, loss mask 0, and only the new suffixes train;
- `branch`: a two-level tree, n/2 paths branched two ways after `branch_tokens` tokens (`envs.tree_rollout`).
Context of a prompt: [1, its last group's mean reward, whether that group had no learning signal, whether it was
seen]. After scoring, `observe(groups)` (the loop calls it with every scored group, as it calls the sampler's)
credits each group's arm with the bandit reward: the group's learning signal (the standard deviation of its
rewards) minus the no-intervention estimate (the mean signal of the `none` groups so far). Shadow-to-live: for the
first `shadow_steps` observed steps every prompt is rolled out plainly, which sets that estimate, then the bandit
chooses. The prompt-level arms (retry, revisit) are the `rail` sampler's (`data.rail`), which shares the bandit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from lmrl.envs.controllers import ROLLOUT_CONTROLLERS, Prefix, continue_from
from lmrl.envs.tree_rollout import TreeRollout

if TYPE_CHECKING:
    from lmrl.engines.base import Completion, SamplingParams
    from lmrl.types import Group

ARM_NAMES = ("none", "resample", "branch")
POLICIES = ("linucb", "thompson")


class LinearBandit:
    """Disjoint linear contextual bandit: per arm a ridge regression of the bandit reward on the context
    (A = ridge·I + Σ x xᵀ, b = Σ r x, θ = A⁻¹ b); LinUCB scores θᵀx + alpha·√(xᵀA⁻¹x), Thompson
    scores θ̃ᵀx with θ̃ ~ N(θ, alpha² A⁻¹)."""

    def __init__(self, arms: int, dim: int, policy: str = "linucb", alpha: float = 0.5, ridge: float = 1.0,
                 seed: int = 0):
        if policy not in POLICIES or alpha < 0 or ridge <= 0:
            raise ValueError(f"need policy in {POLICIES}, alpha ≥ 0, ridge > 0 (got {policy!r}, {alpha}, {ridge})")
        self.policy, self.alpha = policy, float(alpha)
        self.A = torch.eye(dim, dtype=torch.float64).repeat(arms, 1, 1) * ridge
        self.b = torch.zeros(arms, dim, dtype=torch.float64)
        self.gen = torch.Generator().manual_seed(seed)

    def choose(self, x: list[float], allowed: list[int] | None = None, greedy: bool = False) -> int:
        """The arm with the best score for context `x` among `allowed` (greedy: the estimate alone)."""
        v = torch.tensor(x, dtype=torch.float64)
        scores = []
        for a in allowed if allowed is not None else range(len(self.b)):
            inv = torch.linalg.inv(self.A[a])
            theta = inv @ self.b[a]
            if greedy or self.alpha == 0:
                score = float(theta @ v)
            elif self.policy == "linucb":
                score = float(theta @ v) + self.alpha * math.sqrt(float(v @ inv @ v))
            else:
                noise = torch.randn(len(v), generator=self.gen, dtype=torch.float64)
                score = float((theta + self.alpha * torch.linalg.cholesky(inv) @ noise) @ v)
            scores.append((score, a))
        return max(scores, key=lambda s: (s[0], -s[1]))[1]

    def update(self, arm: int, x: list[float], reward: float) -> None:
        v = torch.tensor(x, dtype=torch.float64)
        self.A[arm] += torch.outer(v, v)
        self.b[arm] += reward * v

    def state_dict(self) -> dict[str, Any]:
        return {"A": self.A.clone(), "b": self.b.clone(), "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.A, self.b = state["A"].clone(), state["b"].clone()
        self.gen.set_state(state["gen"])


class RailParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    arms: list[Literal["none", "resample", "branch"]] = Field(default_factory=lambda: list(ARM_NAMES), min_length=1)
    prefix_share: float = Field(0.5, gt=0, lt=1)  # resample: the share of the earlier completion kept as prefix
    branch_tokens: int = Field(16, ge=1)  # branch: tokens before the paths fork
    policy: Literal["linucb", "thompson"] = "linucb"
    alpha: float = Field(0.5, ge=0)
    ridge: float = Field(1.0, gt=0)
    shadow_steps: int = Field(2, ge=0)
    seed: int = 0


@dataclass
class Seen:
    """What a prompt's last scored group left: its mean reward, its signal, its lowest-rewarded completion."""

    mean: float
    signal: float
    worst: Prefix


@ROLLOUT_CONTROLLERS.register("rail", "RAIL: a contextual bandit picks per prompt a plain rollout, a resample from "
                                      "a prefix of its worst completion, or a branching tree (confidence low)")
class RailInterventions:
    def __init__(self, tokenizer=None, **params):
        self.params = p = RailParams(**params)
        self.bandit = LinearBandit(len(ARM_NAMES), 4, p.policy, p.alpha, p.ridge, p.seed)
        self.tree = TreeRollout(segment_tokens=p.branch_tokens, divergence=2, depth=2)
        self.seen: dict[tuple[int, ...], Seen] = {}
        self.baseline = [0.0, 0]  # sum and count of the `none` groups' signals
        self.steps = 0  # observe() calls: scored steps

    def context(self, prompt: list[int]) -> list[float]:
        last = self.seen.get(tuple(prompt))
        return [1.0, 0.0, 0.0, 0.0] if last is None else [1.0, last.mean, float(last.signal == 0), 1.0]

    def allowed(self, prompt: list[int], n: int) -> list[int]:
        last = self.seen.get(tuple(prompt))
        usable = {"none": True, "resample": last is not None and len(last.worst.ids) >= 2, "branch": n >= 2}
        return [ARM_NAMES.index(a) for a in self.params.arms if usable[a]] or [0]

    def choose(self, prompt: list[int], n: int) -> int:
        if self.steps < self.params.shadow_steps:
            return 0
        return self.bandit.choose(self.context(prompt), self.allowed(prompt, n))

    def complete(self, engine, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        arms = [self.choose(p, n) for p in prompts]
        out: list[list[Completion]] = [[] for _ in prompts]
        for arm, name in enumerate(ARM_NAMES):
            at = [i for i, a in enumerate(arms) if a == arm]
            if not at:
                continue
            chosen = [prompts[i] for i in at]
            if name == "none":
                done = engine.generate(chosen, n, params, generator)
            elif name == "branch":
                done = self.tree.complete(engine, chosen, n, params, generator)
            else:
                done = [self.resampled(engine, p, n, params, generator) for p in chosen]
            for i, completions in zip(at, done):
                x = self.context(prompts[i])
                out[i] = [replace(c, info={**c.info, "rail": {"arm": name, "context": x},
                                           "metrics": {f"rail/arm_{a}": float(a == name) for a in self.params.arms}})
                          for c in completions]
        return out

    def resampled(self, engine, prompt: list[int], n: int, params: SamplingParams,
                  generator: torch.Generator | None) -> list[Completion]:
        """`n` continuations of the first `prefix_share` of the prompt's worst completion, the prefix out of the
        loss."""
        worst = self.seen[tuple(prompt)].worst
        k = max(1, min(len(worst.ids) - 1, int(len(worst.ids) * self.params.prefix_share)))
        prefix = Prefix(list(prompt), worst.ids[:k], worst.logprobs[:k], worst.versions[:k])
        room = replace(params, max_new_tokens=max(1, params.max_new_tokens - k))
        done = continue_from(engine, [prefix] * n, room, generator)
        return [replace(c, loss_mask=[0] * k + [1] * (len(c.token_ids) - k)) for c in done]

    def observe(self, groups: list[Group]) -> None:
        """Credit each scored group's arm with its learning signal against the `none` groups' mean, and keep the
        prompt's last group for its next context and resample."""
        self.steps += 1
        for group in groups:
            scored = [x for x in group.samples if x.excluded is None]
            if not scored:
                continue
            rewards = [x.reward for x in scored]
            mean = sum(rewards) / len(rewards)
            signal = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
            chosen = scored[0].info.get("rail")
            if chosen is not None:
                arm = ARM_NAMES.index(chosen["arm"])
                baseline = self.baseline[0] / self.baseline[1] if self.baseline[1] else 0.0
                self.bandit.update(arm, chosen["context"], signal - baseline)
                if arm == 0:
                    self.baseline = [self.baseline[0] + signal, self.baseline[1] + 1]
            worst = min(scored, key=lambda x: x.reward)
            versions = worst.policy_version or [0] * len(worst.completion_ids)
            self.seen[tuple(worst.prompt_ids)] = Seen(mean, signal, Prefix(
                list(worst.prompt_ids), list(worst.completion_ids), list(worst.behaviour_logprobs), list(versions)))

    def state_dict(self) -> dict[str, Any]:
        return {"bandit": self.bandit.state_dict(), "baseline": list(self.baseline), "steps": self.steps,
                "seen": {k: (v.mean, v.signal, v.worst.ids, v.worst.logprobs, v.worst.versions)
                         for k, v in self.seen.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bandit.load_state_dict(state["bandit"])
        self.baseline, self.steps = list(state["baseline"]), state["steps"]
        self.seen = {tuple(k): Seen(m, s, Prefix(list(k), list(ids), list(lps), list(vs)))
                     for k, (m, s, ids, lps, vs) in state["seen"].items()}
