"""Monte-Carlo step values on-policy (`rollout.controller: mc_steps`; VinePPO, Math-Shepherd; specs §6.2).

The group's n completions of a prompt are sampled as usual (one engine call). Each is cut into steps at the
step delimiter (`envs.controllers.step_ends`: where the decoded text completes `delimiter`, at most
`max_steps` steps), and from the end of every step but the last, `k` continuations of the exact token prefix
are sampled: one batched `continue_from` over every prompt's prefixes (each continuation within the
`rollout.max_new_tokens` the completion had, prefix included). The continuations are value-only: they travel
in `Completion.value_rollouts`, the loop scores them with the run's reward as their own groups
(`Group.value_groups`), and they are never trained nor counted in the group's reward, accuracy or filters.
A completion's step ends are in `info["steps"]["ends"]`; the input `mc_step_values` turns the continuations'
rewards into V(s_j) and the estimator `mc_step` into advantages (`algos.mc_step`). Cost in generated tokens:
up to n·(1 + k·(steps − 1)) completions' worth per prompt. Confidence: medium (the Monte-Carlo value and the
step advantage follow VinePPO; its per-step resets of the value continuation budget are not traced).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel, ConfigDict, Field

from lmrl.envs.controllers import ROLLOUT_CONTROLLERS, Prefix, continue_within, needs_tokenizer, step_ends

if TYPE_CHECKING:
    from lmrl.engines.base import Completion, SamplingParams


class McStepParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = Field(4, ge=1)  # continuations from the end of each step but the last
    delimiter: str = Field("\n", min_length=1)  # the text that ends a step
    max_steps: int | None = Field(8, ge=1)  # steps past it join the last one (None: every delimiter)


@ROLLOUT_CONTROLLERS.register("mc_steps", "Monte-Carlo step values: k value-only continuations from the end of "
                                          "each step of each completion, scored but not trained (VinePPO)")
class McStepRollout:
    def __init__(self, tokenizer=None, **params):
        self.params = McStepParams(**params)
        self.tokenizer = tokenizer

    def complete(self, engine, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        t = self.params
        tokenizer = needs_tokenizer(self.tokenizer, "mc_steps", "cuts completions into steps at the delimiter")
        groups = engine.generate(prompts, n, params, generator)
        todo: list[tuple[Completion, int]] = []
        for outs in groups:
            for c in outs:
                ends = step_ends(c.token_ids, tokenizer, t.delimiter, t.max_steps) if c.token_ids else []
                c.info = {**c.info, "steps": {"ends": ends}}
                todo += [(c, end) for end in ends[:-1] if end < params.max_new_tokens for _ in range(t.k)]
        prefixes = [Prefix(prompt, c.token_ids[:end], c.logprobs[:end], own_versions(engine, c)[:end])
                    for (c, end), prompt in zip(todo, prompt_of(groups, prompts, todo))]
        for (c, end), v in zip(todo, continue_within(engine, prefixes, params, params.max_new_tokens, generator)):
            c.value_rollouts.setdefault(end, []).append(v)
        return groups


def own_versions(engine, c: Completion) -> list[int]:
    return list(c.policy_version) or [getattr(engine, "version", 0)] * len(c.token_ids)


def prompt_of(groups: list[list[Completion]], prompts: list[list[int]], todo) -> list[list[int]]:
    """The prompt of each (completion, end) of `todo`."""
    owner = {id(c): prompt for outs, prompt in zip(groups, prompts) for c in outs}
    return [owner[id(c)] for c, _ in todo]
