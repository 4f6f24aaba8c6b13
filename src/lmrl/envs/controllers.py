"""Rollout controllers: what acts inside generation, between the engine and the rollout (`rollout.controller`).

A controller writes a single-turn rollout's completions through the engine instead of one `generate` call:
it may continue from any token prefix of an earlier completion, branch it k ways, and stop a branch. It
sees the engine only through `generate` on token-id prompts, so any engine works (hf, vLLM, the rollout
worker pool, engine servers) and a continuation's tokens and behaviour log-probs are exactly what the engine
sampled given the prefix (`continue_from`). What a controller records about a completion (a tree rollout's
path) travels in `Completion.info` to `Sample.info`, and tokens it would leave out of the loss in
`Completion.loss_mask`; continuations it samples only to value a prefix (scored, never trained) in
`Completion.value_rollouts`. A controller that cuts completions into steps reads the run's tokenizer
(`step_ends`). Registered controllers: `lmrl list rollout-controllers`; the tree rollout is
`envs.tree_rollout`, the Monte-Carlo step values `envs.mc_steps`. Evaluation and sample sources roll out
plainly.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch
from pydantic import ValidationError

from lmrl.errors import ConfigError
from lmrl.registry import Registry

if TYPE_CHECKING:  # the engines package imports transformers; environments are imported without it
    from lmrl.engines.base import Completion, SamplingParams


class RolloutController(Protocol):
    def complete(self, engine, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        """For each prompt, `n` completions."""


ROLLOUT_CONTROLLERS: Registry = Registry("rollout controller")


@dataclass
class Prefix:
    """A partial completion of a prompt, to be continued: its tokens so far with their behaviour log-probs and
    the policy versions that sampled them."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


def continue_from(engine, prefixes: list[Prefix], params: SamplingParams,
                  generator: torch.Generator | None = None) -> list[Completion]:
    """One continuation of each prefix, sampled by the engine given the prompt and the prefix's tokens, up to
    `params.max_new_tokens` new tokens. Each is returned whole, prefix included: the prefix's tokens, log-probs
    and versions as they were sampled, then the new ones as the engine sampled them (nothing re-tokenised)."""
    from lmrl.engines.base import Completion

    if not prefixes:
        return []
    outs = engine.generate([p.prompt + p.ids for p in prefixes], 1, params, generator)
    done = []
    for p, (c, *_) in zip(prefixes, outs):
        versions = c.policy_version or [getattr(engine, "version", 0)] * len(c.token_ids)
        done.append(Completion(p.ids + list(c.token_ids), p.logprobs + list(c.logprobs), c.finish_reason,
                               p.versions + list(versions)))
    return done


def continue_within(engine, prefixes: list[Prefix], params: SamplingParams, budget: int,
                    generator: torch.Generator | None = None) -> list[Completion]:
    """`continue_from` with each prefix's room: a completion of at most `budget` tokens, prefix included. One
    engine call sampling up to the largest room; a continuation past its own room is cut there (finish reason
    "length"), which keeps every kept token and log-prob exactly as sampled."""
    from lmrl.engines.base import Completion

    if not prefixes:
        return []
    rooms = [budget - len(p.ids) for p in prefixes]
    if min(rooms) < 1:
        raise ValueError(f"a prefix of {budget - min(rooms)} tokens leaves no room under the budget of {budget}")
    done = continue_from(engine, prefixes, replace(params, max_new_tokens=max(rooms)), generator)
    out = []
    for c in done:
        if len(c.token_ids) <= budget:
            out.append(c)
        else:
            out.append(Completion(c.token_ids[:budget], c.logprobs[:budget], "length", c.policy_version[:budget]))
    return out


def step_ends(ids: Sequence[int], tokenizer, separator: str, max_steps: int | None = None) -> list[int]:
    """Where each step of a completion's token ids ends (exclusive positions; the last is len(ids)): at the token
    whose decoded text completes a separator after some non-blank text of the step, so leading blank lines stay
    with the step they precede. A blank tail (the end-of-sequence token, trailing new lines) joins the last step;
    with `max_steps`, the steps past it join the last one too."""
    ends, start = [], 0
    for i in range(len(ids)):
        if separator in tokenizer.decode(ids[start: i + 1], skip_special_tokens=True).lstrip():
            ends.append(i + 1)
            start = i + 1
    if start < len(ids) or not ends:
        if ends and not tokenizer.decode(ids[start:], skip_special_tokens=True).strip():
            ends[-1] = len(ids)
        else:
            ends.append(len(ids))
    if max_steps is not None and len(ends) > max_steps:
        ends = [*ends[: max_steps - 1], len(ids)]
    return ends


def needs_tokenizer(tokenizer, controller: str, why: str):
    """The run's tokenizer, or a ValueError saying that this controller cannot work without one."""
    if tokenizer is None:
        raise ValueError(f"rollout controller {controller} {why}, so it needs the tokenizer: build it with "
                         "build_controller(name, params, tokenizer)")
    return tokenizer


def build_controller(name: str | None, params: dict[str, Any], tokenizer=None) -> RolloutController | None:
    """The registered controller `name` built from its knobs and the run's tokenizer (None: plain rollouts)."""
    return None if name is None else ROLLOUT_CONTROLLERS.get(name)(tokenizer=tokenizer, **params)


def check_controller(cfg) -> None:
    """A controller writes single-turn completions: it must be registered, its knobs valid, and no environment
    named (an episode's turns are the episode runner's)."""
    r = cfg.rollout
    if r.controller is None:
        if r.controller_params:
            raise ConfigError("rollout.controller_params is set but rollout.controller is not: name the controller")
        return
    if r.controller not in ROLLOUT_CONTROLLERS:
        raise ConfigError(f"rollout.controller: {ROLLOUT_CONTROLLERS.unknown_message(r.controller)}")
    if cfg.env.name is not None:
        raise ConfigError(f"rollout.controller={r.controller} writes single-turn completions, but env.name="
                          f"{cfg.env.name} plays episodes whose turns the episode runner samples: unset one of them")
    try:
        build_controller(r.controller, r.controller_params)
    except ValidationError as err:
        wrong = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e['input']!r})" for e in err.errors())
        raise ConfigError(f"rollout.controller_params of {r.controller}: {wrong}") from None
