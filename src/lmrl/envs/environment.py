"""The environment protocol: what a multi-turn environment implements, and the registry that names them.

An environment is a plain Python object with two methods, driven by the episode runner
(`lmrl.envs.episodes`), which batches the turns of every live episode into one engine call:

    reset(row, seed) -> (messages, state)
        the episode's opening chat (system / user messages; the last is not the assistant's) and any
        state the environment keeps for it; `seed` makes the episode's randomness reproducible.
    step(reply, state) -> Step
        the policy's reply (decoded text of its turn) in, the environment's answer out: the
        observation messages that continue the chat (tool results, the next user or game message),
        this turn's reward, and whether the episode is over.

Both are synchronous and see one episode at a time, so a user writes an environment as a class in a
file and names it from the CLI (`env.name=my_env.py:Maze`); the runner does the batching, the
token bookkeeping, limits, timeouts and error handling. Optional: a `tools` attribute (JSON schemas
for the chat template's `tools=`; docs/environments.md).
"""
from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from lmrl.registry import Registry

ENVIRONMENTS: Registry = Registry("environment")


class EnvError(RuntimeError):
    """An environment that raised, hung or answered with something malformed: its episode is excluded."""


@dataclass
class Step:
    """The environment's answer to one policy turn."""

    observation: list[dict[str, Any]] | None  # messages continuing the chat; None when the episode is over
    reward: float = 0.0  # this turn's reward
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # free-form; a "metrics" dict of floats is logged


class Environment(Protocol):
    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], Any]:
        """The opening messages of an episode on task row `row`, and its state."""

    def step(self, reply: str, state: Any) -> Step:
        """The environment's answer to the policy's reply."""


def check_messages(messages: Any, what: str) -> list[dict[str, Any]]:
    """`messages` if it is a list of {role, content} dicts with string values, else an EnvError."""
    if not isinstance(messages, list) or not messages:
        raise EnvError(f"{what}: expected a non-empty list of {{role, content}} messages, "
                       f"got {type(messages).__name__}")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise EnvError(f"{what}: each message must be a dict with string 'role' and 'content', got {m!r:.80}")
    return messages


def check_step(step: Any) -> Step:
    """A well-formed Step (a finite float reward, a bool done, messages when not done), else an EnvError."""
    if not isinstance(step, Step):
        raise EnvError(f"step returned {type(step).__name__}, not a Step")
    reward = step.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise EnvError(f"step reward must be a finite number, got {reward!r}")
    if not isinstance(step.done, bool):
        raise EnvError(f"step done must be a bool, got {step.done!r}")
    if not step.done:
        check_messages(step.observation, "step observation")
    if not isinstance(step.info, dict):
        raise EnvError(f"step info must be a dict, got {type(step.info).__name__}")
    metrics = step.info.get("metrics", {})
    if not isinstance(metrics, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in metrics.items()):
        raise EnvError(f"step info['metrics'] must map names to numbers, got {metrics!r:.80}")
    return step


def build_env(name: str, params: dict[str, Any] | None = None) -> Environment:
    """The environment `name` (registered, or `file.py:Class`) built with `params`; one per name and params."""
    return _build(name, json.dumps(params or {}, sort_keys=True, default=str))


@lru_cache(maxsize=16)
def _build(name: str, params_json: str) -> Environment:
    target = ENVIRONMENTS.get(name)
    params = json.loads(params_json)
    env = target(**params) if inspect.isclass(target) or inspect.isfunction(target) else target
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise TypeError(f"environment {name!r} has no {method}() method (docs/environments.md: the protocol)")
    return env


def forget_built_environments() -> None:
    """Drop the built environments, so that a class registered again under a name is built anew."""
    _build.cache_clear()
