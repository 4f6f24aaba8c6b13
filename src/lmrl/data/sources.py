"""Batch sources: where each step's batch comes from (`batches.source`, docs/stages/index.md).

`rollouts` is the policy's own rollouts, made by the loop (inline or in the background) and scored by the
reward: the RL step, with advantages and the policy-gradient term. Every other source is an offline
dataset read once, encoded into token ids once (`Sample`s of origin `DATASET`) and trained by the terms
of `algo.terms` alone: `sft` (demonstrations, loss on the assistant's tokens), `pairs` (preference
pairs, one group of [chosen, rejected] each, for DPO-family and reward-model terms) and `unpaired`
(KTO's desirable / undesirable rows). An entry is a function `(batches config, tokenizer) ->
OfflineData`; its `BatchSourceSpec` says what the loop and the validation derive from it.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from lmrl.config import BatchesConfig
from lmrl.registry import Registry
from lmrl.types import Group, Sample


@dataclass(frozen=True)
class BatchSourceSpec:
    online: bool = False  # the loop rolls the policy out for it: rewards, advantages, the policy-gradient term
    pairs: bool = False  # each group is a preference pair (chosen, rejected): what pairwise terms compare
    formats: frozenset[str] = frozenset()  # the dataset formats it reads (`batches.format`)

    def __post_init__(self):
        object.__setattr__(self, "formats", frozenset(self.formats))


@dataclass
class OfflineData:
    """An offline source's encoded rows: the training groups, the held-out ones (the eval loss), and how many
    dataset rows were left out, by reason."""

    train: list[Group]
    eval: list[Group] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    source: str = ""

    def summary(self) -> str:
        left_out = "; ".join(f"{n} left out: {why}" for why, n in self.dropped.items())
        return (f"{self.source}: {len(self.train)} training rows, {len(self.eval)} held out"
                + (f" ({left_out})" if left_out else ""))


BATCH_SOURCES: Registry = Registry("batch source", declares=BatchSourceSpec)

Encoder = Callable[[dict, str, Any, int], "list[Sample] | str"]  # (record, format, tokenizer, max_tokens)


@BATCH_SOURCES.register("rollouts", "the policy's own rollouts of the task's prompts, scored by the reward (RL)",
                        online=True)
def rollouts(cfg: BatchesConfig, tokenizer) -> None:
    """Made by the step loop itself (`loops.inline`, `loops.background`): there is nothing to read up front."""
    return None


def encoded_groups(cfg: BatchesConfig, tokenizer, encode: Encoder, fmt: str) -> OfflineData:
    """Read `batches.dataset` (and `batches.params.eval_dataset`), encode every record into one group, and hold
    `batches.num_eval` rows out (a seeded shuffle) when no eval dataset is given."""
    from lmrl.data.sft import read_records

    if cfg.dataset is None:
        raise ValueError(f"batches.source={cfg.source} reads an offline dataset: set batches.dataset")
    dropped: Counter = Counter()

    def groups_of(records: list[dict], prefix: str) -> list[Group]:
        out = []
        for i, record in enumerate(records):
            got = encode(record, fmt, tokenizer, cfg.max_tokens)
            if isinstance(got, str):
                dropped[got] += 1
                continue
            out.append(Group(f"{prefix}{i}", record, got))
        return out

    train = groups_of(read_records(cfg.dataset, cfg.params), "row-")
    held_name = cfg.params.get("eval_dataset")
    if held_name is not None:
        held = groups_of(read_records(held_name, {**cfg.params, "split": cfg.params.get("eval_split", "train")}),
                         "eval-")[: cfg.num_eval or None]
    else:
        random.Random(cfg.params.get("seed", 0)).shuffle(train)
        held, train = train[: cfg.num_eval], train[cfg.num_eval:]
    if not train:
        reasons = "; ".join(f"{n}: {why}" for why, n in dropped.items()) or "the dataset is empty"
        raise ValueError(f"batches.dataset {cfg.dataset}: no row left to train on ({reasons})")
    return OfflineData(train, held, dict(dropped), f"{cfg.source} {cfg.dataset}")


@BATCH_SOURCES.register("sft", "supervised rows (chat messages, prompt/completion or plain text): the loss on the "
                        "assistant's tokens", formats={"messages", "prompt_completion", "text"})
def sft(cfg: BatchesConfig, tokenizer) -> OfflineData:
    from lmrl.data.sft import encode_sft

    assistant_only = bool(cfg.params.get("assistant_only", True))

    def encode(record, fmt, tokenizer, max_tokens):
        got = encode_sft(record, fmt, tokenizer, max_tokens, assistant_only=assistant_only)
        return got if isinstance(got, str) else [got]
    return encoded_groups(cfg, tokenizer, encode, cfg.format)


@BATCH_SOURCES.register("pairs", "preference pairs (chosen / rejected, TRL's format): one group per pair",
                        pairs=True, formats={"preference"})
def pairs(cfg: BatchesConfig, tokenizer) -> OfflineData:
    from lmrl.data.sft import encode_pair

    def encode(record, fmt, tokenizer, max_tokens):
        got = encode_pair(record, fmt, tokenizer, max_tokens)
        return got if isinstance(got, str) else list(got)
    return encoded_groups(cfg, tokenizer, encode, cfg.format)


@BATCH_SOURCES.register("unpaired", "rows labelled desirable or not (prompt, completion, label: KTO's format)",
                        formats={"unpaired"})
def unpaired(cfg: BatchesConfig, tokenizer) -> OfflineData:
    from lmrl.data.sft import encode_unpaired

    def encode(record, fmt, tokenizer, max_tokens):
        got = encode_unpaired(record, fmt, tokenizer, max_tokens)
        return got if isinstance(got, str) else [got]
    return encoded_groups(cfg, tokenizer, encode, cfg.format)
