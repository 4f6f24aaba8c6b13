"""The records that flow between stages: Sample (one trajectory), Group (one prompt's samples), Batch.

Token ids are the truth: the learner trains on exactly the ids the engine produced. A Sample says
where it came from (`Origin`); what the loop and the algorithm do with it follows from that.
"""
from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch


class Origin(Enum):
    """Where a sample came from: rolled out by the policy being trained, or added from elsewhere
    (docs/methods/demonstrations.md). Its properties decide how the batch treats it; a new kind of
    sample (an environment's turn, a replayed sample) is a new member with its answers to them."""

    SAMPLED = "sampled"  # the engine rolled it out from the current policy
    DEMONSTRATION = "demonstration"  # a reference completion from the task data, one more member of its group
    RESCUE = "rescue"  # a reference completion for a group where nothing succeeded, in a group of its own
    PEER = "peer"  # another policy's completion, with that policy's log-probability
    GUIDED = "guided"  # the policy's completion of a guided prompt, replayed as a member under the original prompt
    PRIVILEGED = "privileged"  # the same, kept in a group of its own for a supervised term only
    REPLAYED = "replayed"  # a recorded rollout of an earlier run (rollouts.jsonl), with its behaviour log-probs
    DATASET = "dataset"  # a supervised row of an offline dataset (SFT, preference pairs), no log-probs, no advantage

    @property
    def sampled(self) -> bool:
        """Sampled by the policy being trained (the batch's `demonstration` flag is 0 exactly here)."""
        return self is Origin.SAMPLED

    @property
    def in_advantage(self) -> bool:
        """Enters the advantage estimate; rescue, privileged and dataset rows are trained only by a supervised
        (or preference) term."""
        return self not in (Origin.RESCUE, Origin.PRIVILEGED, Origin.DATASET)

    @property
    def brings_logprobs(self) -> bool:
        """Comes with behaviour log-probs (the engine's, or the peer's); otherwise the current policy's
        stand in, filled before the update, so its importance ratio starts at 1."""
        return self in (Origin.SAMPLED, Origin.PEER, Origin.REPLAYED)


class SampleInfo(MutableMapping):
    """A sample's `info`: free entries (metrics, transcripts, reward details) plus the keys "text" and
    "row", which read and write the sample's typed fields. Code written against `info["text"]` and
    `info["row"]` (reward functions, environments of users) sees exactly `Sample.text` and `Sample.row`:
    the fields are the one place these values live."""

    FIELDS = ("text", "row")

    def __init__(self, sample: "Sample", entries: dict[str, Any]):
        self.sample, self.entries = sample, entries

    def __getitem__(self, key: str) -> Any:
        return getattr(self.sample, key) if key in self.FIELDS else self.entries[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in self.FIELDS:
            setattr(self.sample, key, value)
        else:
            self.entries[key] = value

    def __delitem__(self, key: str) -> None:
        if key in self.FIELDS:
            raise TypeError(f"info[{key!r}] is the field Sample.{key}; it cannot be deleted")
        del self.entries[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.FIELDS
        yield from self.entries

    def __len__(self) -> int:
        return len(self.FIELDS) + len(self.entries)

    def __repr__(self) -> str:
        return repr(dict(self))


@dataclass
class Sample:
    """One trajectory: prompt ids followed by everything generated after them (for a multi-turn episode,
    every turn: the policy's tokens and the environment's, told apart by `loss_mask`).

    `text` is the decoded completion (an episode's last reply), `row` the task row it answers; `info`
    holds everything else, and reads these two under "text" and "row" too (`SampleInfo`)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    finish_reason: str = "stop"  # "stop" (EOS) or "length"
    policy_version: list[int] = field(default_factory=list)
    rewards: dict[str, float | None] = field(default_factory=dict)
    reward: float | None = None
    excluded: str | None = None  # why this sample is left out of the update (reward error, NaN, …)
    info: MutableMapping[str, Any] = field(default_factory=dict)
    origin: Origin = Origin.SAMPLED
    # per completion token: 1 = the policy generated it (trained), 0 = an environment's token (context
    # only, behaviour log-prob 0.0); None = every completion token is the policy's (single-turn)
    loss_mask: list[int] | None = None
    text: str = ""
    row: dict[str, Any] = field(default_factory=dict)
    role: str = ""  # the run's role that generated it ("" the policy; docs/roles.md)

    def __post_init__(self) -> None:
        """Wrap `info` as this sample's SampleInfo; a copy (`dataclasses.replace`) shares the entries."""
        entries = self.info.entries if isinstance(self.info, SampleInfo) else self.info
        clash = next((k for k in SampleInfo.FIELDS if k in entries), None)
        if clash is not None:
            raise ValueError(f"Sample.info[{clash!r}] is the field Sample.{clash}: pass {clash}=... instead")
        self.info = SampleInfo(self, entries)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (a checkpoint's queued batches): a sample pickled before `text` and `row` were fields
        kept them in its `info` dict; they move to the fields."""
        info = state.get("info", {})
        entries = dict(info.entries if isinstance(info, SampleInfo) else info)
        for key in SampleInfo.FIELDS:
            if key in entries and key not in state:
                state[key] = entries.pop(key)
        state.setdefault("text", "")
        state.setdefault("row", {})
        state.setdefault("role", "")
        self.__dict__.update({**state, "info": {}})
        self.info = SampleInfo(self, entries)

    @property
    def in_advantage(self) -> bool:
        return self.origin.in_advantage

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def num_generated(self) -> int:
        """Tokens the policy generated (an environment's tokens in a multi-turn episode do not count)."""
        return len(self.completion_ids) if self.loss_mask is None else sum(self.loss_mask)


@dataclass
class Group:
    """The samples of one prompt; group-relative methods need them together."""

    uid: str
    row: dict[str, Any]
    samples: list[Sample]
    # value-only rollouts (a rollout controller's `Completion.value_rollouts`): one group per continued prefix,
    # its samples' info["value_of"] = {"key": the continued sample's info["steps"]["key"], "end": prefix length}.
    # The loop scores them with the run's reward; they never enter a batch, a filter or the group's metrics.
    value_groups: list["Group"] = field(default_factory=list)

    @property
    def rewards(self) -> list[float | None]:
        return [s.reward for s in self.samples]

    @property
    def scored(self) -> list[Sample]:
        """The samples that enter the update (not excluded), in batch order."""
        return [x for x in self.samples if x.excluded is None]


@dataclass
class Batch:
    """Samples packed into right-padded tensors for the learner.

    `completion_mask` marks generated tokens (shifted: position t predicts token t+1, so the masks
    and per-token tensors have width T-1). Advantages and any algorithm-specific per-token tensors
    are filled in by the algorithm before the learner sees the batch.

    Three kinds of per-sample inputs travel with the batch, filled by the input providers
    (`lmrl.inputs`): `extras` are per-token ([B, T-1, ...], trimmed with the tokens when rows
    are selected) or per-row ([B]); `row_extras` have any shape [B, ...] and are only row-selected
    (reward components [B, K], peer rewards [B, P], the origin flags `demonstration` and
    `in_advantage`); `context` holds batch-level values (training step, total steps, component names).
    """

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    completion_mask: torch.Tensor  # [B, T-1] float: 1 on tokens the policy generated
    behaviour_logprobs: torch.Tensor  # [B, T-1] float, aligned with completion_mask
    sequence_rewards: torch.Tensor  # [B] float
    group_index: torch.Tensor  # [B] long: which group each row belongs to
    advantages: torch.Tensor | None = None  # [B, T-1]
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    row_extras: dict[str, torch.Tensor] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor | list[int]) -> "Batch":
        """A sub-batch with the given rows, trimmed to its longest sequence."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[idx].sum(1).max().item()) if idx.numel() else 1

        def take(t: torch.Tensor | None, w: int) -> torch.Tensor | None:
            if t is None:
                return None
            t = t[idx]
            return t[:, :w] if t.dim() > 1 else t

        return Batch(
            input_ids=take(self.input_ids, width),
            attention_mask=take(self.attention_mask, width),
            completion_mask=take(self.completion_mask, width - 1),
            behaviour_logprobs=take(self.behaviour_logprobs, width - 1),
            sequence_rewards=take(self.sequence_rewards, 0),
            group_index=take(self.group_index, 0),
            advantages=take(self.advantages, width - 1),
            extras={k: take(v, width - 1) for k, v in self.extras.items()},
            row_extras={k: v[idx] for k, v in self.row_extras.items()},
            context=dict(self.context),
        )


def collate(samples: list[Sample], group_index: list[int], pad_id: int) -> Batch:
    """Right-pad samples into a Batch, with the completion mask aligned to next-token predictions.

    A sample's `loss_mask` (multi-turn episodes) zeroes the completion mask on environment tokens."""
    width = max(len(s.input_ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    cmask = torch.zeros((n, width - 1))
    blp = torch.zeros((n, width - 1))
    for i, s in enumerate(samples):
        seq = s.input_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        start, end = len(s.prompt_ids) - 1, len(seq) - 1
        cmask[i, start:end] = 1.0 if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=torch.float)
        blp[i, start:end] = torch.tensor(s.behaviour_logprobs, dtype=torch.float)
    rewards = torch.tensor([0.0 if s.reward is None else float(s.reward) for s in samples])  # offline rows: none
    return Batch(ids, attn, cmask, blp, rewards, torch.tensor(group_index, dtype=torch.long))
