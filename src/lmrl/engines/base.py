"""The engine interface: generate completions with behaviour log-probs; accept new weights."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from lmrl.registry import Registry

ENGINES: Registry = Registry("engine")


@dataclass
class SamplingParams:
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    # Keep each finished row's KV for the next call, which then prefills only what its prompts add
    # (multi-turn episodes; the hf engine, `engines.prefix_cache`). Other engines ignore it: vLLM has
    # its own prefix cache.
    keep_prefix: bool = False


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each token under the sampling distribution (logits / temperature)
    finish_reason: str  # "stop" or "length"
    policy_version: list[int] = field(default_factory=list)
    # set by a rollout controller (`envs.controllers`): tokens it wrote itself are 0 (no loss), and what it
    # records about the completion (a tree rollout's path) goes to `Sample.info`
    loss_mask: list[int] | None = None
    info: dict = field(default_factory=dict)
    # value-only continuations a controller sampled from a prefix of this completion: prefix length -> the
    # continuations, each whole (prefix included); scored by the run's reward, never trained (`Group.value_groups`)
    value_rollouts: dict[int, list["Completion"]] = field(default_factory=dict)


@dataclass
class TokenScores:
    """A token sequence scored by a model: the log-prob of each token after the first given the tokens before it,
    and at each of those positions the likeliest tokens as (token id, log-prob), best first."""

    logprobs: list[float]
    top: list[list[tuple[int, float]]]


class Engine(Protocol):
    version: int

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        """For each prompt, `n` completions."""

    def update_weights(self, named_tensors: dict[str, torch.Tensor] | None, version: int) -> dict[str, float]:
        """Load new policy weights (None: from the learner's module, shared or re-read) and set the version.

        Returns the push's metrics for the step's log (e.g. `timing/weight_sync_s`; none when shared)."""
