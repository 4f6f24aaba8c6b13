"""Simulated users: a language model plays the user (a shopper, a patient) of a multi-turn environment.

A user is any object with `chat(messages, max_tokens=, temperature=, seed=) -> str`. Two kinds ship:

- in-process, `LocalUser`: a model lmrl can load (`default`, a transformers directory, a .gguf file)
  or a (model, tokenizer) pair, answered through `lmrl serve`'s `ChatService`, so the chat template
  and the generation are the endpoint's; its lock serialises generation, so the environment's
  worker threads can share one user;
- over HTTP: `JudgeClient` (thread-safe, with retries and a cache) on any OpenAI-compatible
  endpoint, e.g. a running `lmrl serve`.

`make_user(spec)` chooses between them. `SimulatedUser` adds the role-play: the simulator gets its
own system prompt (persona and hidden goal) and sees the conversation with roles swapped (the
policy's turns are its "user" messages); its reply becomes the environment's observation.
docs/env_simulated_users.md.
"""
from __future__ import annotations

import inspect
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lmrl.envs.roles import RoleUser
from lmrl.rewards.judge_client import JudgeClient


def load_local(path: str, device: str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) for a model argument, loaded once per process (users and scorers share it)."""
    return _load(str(path), str(device))


@lru_cache(maxsize=4)
def _load(path: str, device: str) -> tuple[Any, Any]:
    from lmrl.models import load_model, load_tokenizer, resolve_model_path

    resolved = resolve_model_path(path)
    return load_model(resolved).to(device).eval().requires_grad_(False), load_tokenizer(resolved)


class LocalUser:
    """A model in this process answering chats through `lmrl serve`'s ChatService (no HTTP)."""

    def __init__(self, model: Any = "default", tokenizer: Any = None, device: str = "cpu",
                 max_tokens_limit: int = 1024):
        from lmrl.serve import ChatService  # the engines import transformers: not at `import lmrl.envs`

        if isinstance(model, (str, os.PathLike)):
            model, tokenizer = load_local(str(model), device)
        elif tokenizer is None:
            raise ValueError("a simulated user given a model object needs its tokenizer too: (model, tokenizer)")
        self.service = ChatService(model, tokenizer, model_name="simulated-user", max_tokens_limit=max_tokens_limit)

    def chat(self, messages: list[dict[str, str]], max_tokens: int | None = None, temperature: float | None = None,
             seed: int | None = None) -> str:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
        return self.service.complete(body)["choices"][0]["message"]["content"]


def make_user(spec: Any) -> Any:
    """The user a spec names: an object with chat() as is; a (model, tokenizer) pair, a model path or
    {"model": path, "device": ...} in-process; {"base_url": ..., "model": ..., ...} (JudgeClient
    options) over HTTP; {"role": name}: the run's role `name` (docs/roles.md), which may learn."""
    if callable(getattr(spec, "chat", None)):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return LocalUser(*spec)
    if isinstance(spec, (str, os.PathLike)):
        return LocalUser(spec)
    if isinstance(spec, Mapping):
        if set(spec) == {"role"}:
            return RoleUser(str(spec["role"]))
        if "base_url" in spec:
            return JudgeClient.from_params(dict(spec))
        if "model" in spec:
            return LocalUser(**spec)
    raise TypeError(f"simulated user: expected a model path, (model, tokenizer), {{'model': path}}, "
                    f"{{'base_url': url, ...}} or an object with chat(); got {spec!r:.80}")


def normalize(text: str) -> str:
    """Lower case, punctuation to spaces, whitespace collapsed: how names are compared with what was said."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def mentioned_names(texts: list[str], names: list[str]) -> list[str]:
    """The `names` (product names, diagnoses) that appear as whole words, case-insensitively, in `texts`."""
    said = " " + " ".join(normalize(t) for t in texts) + " "
    return [n for n in names if f" {normalize(n)} " in said]


def user_view(system: str, transcript: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation as the simulator sees it: its system prompt, then the policy's turns as "user"
    messages and its own as "assistant". Its own lines before the policy's first turn (the opening)
    go into the system prompt, so the chat starts with a user message as every template accepts."""
    turns = [m for m in transcript if m["role"] != "system"]
    opening = []
    while turns and turns[0]["role"] != "assistant":
        opening.append(turns.pop(0)["content"])
    if opening:
        system = f"{system}\n\nYou opened the conversation by saying: {' '.join(opening)}"
    swapped = [{"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]} for m in turns]
    return [{"role": "system", "content": system}, *swapped]


@dataclass
class SimulatedUser:
    """A user model with its sampling settings; `reply` plays one turn of a persona."""

    client: Any
    max_tokens: int = 64
    temperature: float = 0.7

    @classmethod
    def build(cls, spec: Any, max_tokens: int = 64, temperature: float = 0.7) -> "SimulatedUser":
        return cls(make_user(spec), max_tokens, temperature)

    def reply(self, system: str, transcript: list[dict[str, str]], seed: int, row: dict[str, Any] | None = None,
              group: str | None = None) -> str:
        """The simulator's next message, given its system prompt and the policy-side transcript; a simulator that is a
        role of the run (its `chat` takes `row` and `group`) records it with `row`, what its reward reads, in its
        group `group`."""
        takes = inspect.signature(self.client.chat).parameters
        recorded = {"row": row, "group": group} if "row" in takes and "group" in takes else {}  # a role's client
        text = self.client.chat(user_view(system, transcript), max_tokens=self.max_tokens,
                                temperature=self.temperature, seed=seed % 2**31, **recorded)
        return text.strip()
