"""Stepwise-supervision rows (TRL's format: `prompt`, `completions` a list of steps, `labels` one per step) as
Samples for a process reward model (docs/stages/process_reward_model.md).

A row is encoded by `models.steps.step_ids`, TRL's `PRMTrainer.tokenize_row`: the prompt (BOS in front when
the tokenizer has one), then each step's ids followed by the separator's. The label of a step sits on its
last token: `loss_mask` is 1 there and nothing else is trained, and `info["step_labels"]` holds the labels
aligned with the completion's tokens (0.0 off the step ends). A label is a boolean (true: a correct step) or
a number in [0, 1], a soft label such as Math-Shepherd's share of rollouts from the step that reach the gold
answer. The completion is cut to `max_completion_tokens`, then the row to `max_tokens`, keeping the start
(TRL's max_completion_length and max_length); a step whose end is cut off is not trained. The token ids as
encoded are the row from then on.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from lmrl.data.sft import NOTHING_LEFT, Skipped
from lmrl.envs.tasks import TaskError
from lmrl.models.steps import DEFAULT_SEPARATOR, step_ids
from lmrl.types import Origin, Sample


def step_label(value: Any, where: str) -> float:
    """A step's label as the probability that it is correct: true 1.0, false 0.0, a number in [0, 1] as is."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise TaskError(f"{where}: a step label is {value!r}; expected true / false or a number in [0, 1]")
    return float(value)


def encode_steps(record: dict[str, Any], tokenizer, max_tokens: int, max_completion_tokens: int | None = None,
                 separator: str = DEFAULT_SEPARATOR, where: str = "record") -> Sample | Skipped:
    """One stepwise row as a Sample labelled at its step ends; `Skipped` when no step end is left within the
    length limits. A malformed row (steps and labels of different lengths, a label outside [0, 1]) is refused."""
    prompt, steps, labels = record["prompt"], record["completions"], record["labels"]
    if not isinstance(prompt, str):
        raise TaskError(f"{where}: field 'prompt' is a {type(prompt).__name__}, not a string")
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise TaskError(f"{where}: field 'completions' must be a list of step strings")
    if not isinstance(labels, list) or len(labels) != len(steps):
        count = len(labels) if isinstance(labels, list) else type(labels).__name__
        raise TaskError(f"{where}: {len(steps)} steps in 'completions' but {count} labels in 'labels'; each step "
                        "has one label")
    if not steps:
        raise TaskError(f"{where}: field 'completions' has no step")
    values = [step_label(v, f"{where} label {i}") for i, v in enumerate(labels)]
    encoded = step_ids(tokenizer, prompt, steps, separator)
    if not encoded.prompt_ids:
        raise TaskError(f"{where}: the prompt encodes to no token and the tokenizer has no BOS; nothing precedes "
                        "the first step")
    room = max_tokens - len(encoded.prompt_ids)
    if max_completion_tokens is not None:
        room = min(room, max_completion_tokens)
    completion = encoded.completion_ids[: max(room, 0)]
    kept = [(end, v) for end, v in zip(encoded.ends, values) if end < len(completion)]
    if not kept:
        return Skipped(NOTHING_LEFT)
    mask, step_labels = [0] * len(completion), [0.0] * len(completion)
    for end, v in kept:
        mask[end], step_labels[end] = 1, v
    return Sample(prompt_ids=encoded.prompt_ids, completion_ids=completion,
                  behaviour_logprobs=[0.0] * len(completion),
                  finish_reason="length" if len(completion) < len(encoded.completion_ids) else "stop",
                  info={"step_labels": step_labels}, origin=Origin.DATASET, loss_mask=mask,
                  text=tokenizer.decode(completion), row=record)


def step_encoder(max_completion_tokens: int | None, separator: str):
    """An `encode_records`-shaped encoder of stepwise rows with these knobs (`data.sources.encoded_groups`)."""
    from lmrl.data.sft import _where

    def encode(records: list[dict[str, Any]], fmt: str, tokenizer, max_tokens: int, assistant_only: bool = True
               ) -> tuple[list[Sample], Counter]:
        kept, skipped = [], Counter()
        for i, record in enumerate(records):
            out = encode_steps(record, tokenizer, max_tokens, max_completion_tokens, separator, _where(records, i))
            if isinstance(out, Skipped):
                skipped[out.reason] += 1
            else:
                kept.append(out)
        return kept, skipped
    return encode


def last_step_only(sample: Sample) -> Sample:
    """The sample trained on its last labelled step alone (TRL's `train_on_last_step_only`)."""
    last = max(i for i, m in enumerate(sample.loss_mask) if m)
    return replace(sample, loss_mask=[int(i == last) for i in range(len(sample.loss_mask))])
