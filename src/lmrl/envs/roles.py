"""A run's roles as its environments and rewards see them: clients that answer chats and record what they sampled.

A role (a simulated user, an opponent, a judge; `roles:` in the config, docs/roles.md) is reached by name:
`role_client(name)` gives the running role's `RoleClient`, whose `chat(messages, …)` answers like any simulated
user (`envs.simulated_user`: `{"role": name}` as a user spec) and, for a role that trains, records the sample
exactly as the role's engine produced it: the chat's token ids as its prompt, the sampled ids, their behaviour
log-probs and the role's policy version. Nothing is re-tokenised: the role learns from those ids.

The caller passes `row`, what the role's reward reads (the environment's episode state, say), and `group`, the
key that groups its samples for a group-relative estimate. The row is read when the step's rollouts are done, so
an environment may hand over its episode state and fill in the outcome when the episode ends. Several threads may
call one client (the episode runner's worker threads); its lock serialises the engine, and its samples are put in
order (by group, then seed) so a run's batches do not depend on which thread ran first.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lmrl.envs.chat import encode_opening
from lmrl.types import Group, Sample

_CLIENTS: dict[str, "RoleClient"] = {}


@dataclass
class RoleClient:
    """Chats with one role's engine. `switch`: a context manager factory that puts the role's weights in place
    (its adapter on a shared base, under the base's lock); `trains`: record each answer as a sample."""

    name: str
    engine: Any
    tokenizer: Any
    params: Any  # SamplingParams: the role's own temperature and reply length
    trains: bool = False
    switch: Any = contextlib.nullcontext
    records: list[tuple[str, int, Sample]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def chat(self, messages: list[dict[str, str]], max_tokens: int | None = None, temperature: float | None = None,
             seed: int | None = None, row: dict[str, Any] | None = None, group: str | None = None) -> str:
        """The role's reply to `messages` as text (sampled at the role's own temperature: its log-probs are trained
        at it, so the caller's `temperature` is not used)."""
        return self.answer(messages, max_tokens, seed, row, group).text

    def answer(self, messages: list[dict[str, str]], max_tokens: int | None = None, seed: int | None = None,
               row: dict[str, Any] | None = None, group: str | None = None) -> Sample:
        """The role's reply to `messages` as a Sample: the chat's token ids, the sampled ids, their behaviour
        log-probs, its version; recorded for its update when the role trains."""
        prompt = encode_opening(self.tokenizer, messages)
        params = self.params if max_tokens is None else replace(
            self.params, max_new_tokens=max(1, min(max_tokens, self.params.max_new_tokens)))
        seed = 0 if seed is None else int(seed)
        with self.lock, self.switch():
            out = self.engine.generate([prompt], 1, params, torch.Generator().manual_seed(seed))[0][0]
            version = self.engine.version
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        sample = Sample(list(prompt), list(out.token_ids), list(out.logprobs), out.finish_reason,
                        policy_version=[version] * len(out.token_ids), text=text, row=row if row is not None else {},
                        role=self.name)
        if self.trains:
            with self.lock:
                self.records.append((str(group if group is not None else sample.row.get("uid", "")), seed, sample))
        return sample

    def take(self) -> list[Group]:
        """The samples recorded since the last call, in groups by key (in key order, each by seed), each sample's
        row copied as it is now (the episode over)."""
        with self.lock:
            records, self.records = sorted(self.records, key=lambda r: (r[0], r[1])), []
        groups: dict[str, list[Sample]] = {}
        for key, _, sample in records:
            sample.row = dict(sample.row)
            groups.setdefault(key, []).append(sample)
        return [Group(uid=f"{self.name}/{key}", row=samples[0].row, samples=samples) for key, samples in groups.items()]


def register_role_clients(clients: dict[str, RoleClient]) -> None:
    """The running roles, from now on: what `role_client` finds (a new run's replace an earlier run's)."""
    _CLIENTS.clear()
    _CLIENTS.update(clients)


@contextlib.contextmanager
def unrecorded():
    """Within the block the roles answer without recording (an evaluation's episodes: never trained on)."""
    saved = {name: client.trains for name, client in _CLIENTS.items()}
    for client in _CLIENTS.values():
        client.trains = False
    try:
        yield
    finally:
        for name, trains in saved.items():
            _CLIENTS[name].trains = trains


def role_client(name: str) -> RoleClient:
    """The running role `name`'s client; an error naming the roles this run has when it has none such."""
    if name not in _CLIENTS:
        known = ", ".join(sorted(_CLIENTS)) or "none"
        raise KeyError(f"no role {name!r} in this run (its roles: {known}); declare it under `roles:` (docs/roles.md)")
    return _CLIENTS[name]


@dataclass
class RoleUser:
    """A simulated user's client that is a role of the run, found by name when it is first asked (the environment
    may be built before the run's roles are). `row` and `group` go to the role's records."""

    role: str

    def chat(self, messages: list[dict[str, str]], max_tokens: int | None = None, temperature: float | None = None,
             seed: int | None = None, row: dict[str, Any] | None = None, group: str | None = None) -> str:
        return role_client(self.role).chat(messages, max_tokens, temperature, seed, row=row, group=group)
