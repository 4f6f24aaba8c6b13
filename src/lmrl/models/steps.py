"""A stepwise reasoning trace as token ids, encoded as TRL's `PRMTrainer.tokenize_row` encodes it: the one rule
that a process reward model's training rows (`data.steps`) and its reward (`rewards.process_reward`) share,
so a reply is scored on the very tokens the model was trained on.

The prompt is tokenised without special tokens, with BOS in front when the tokenizer has one; each step is
tokenised on its own (without the separators around it, `bare_step`), without special tokens, and followed by
the ids of `separator` (default "\\n"). A step's
label sits on its last token, the separator's last token. No EOS is appended.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SEPARATOR = "\n"


@dataclass(frozen=True)
class StepIds:
    prompt_ids: list[int]
    completion_ids: list[int]  # every step's ids, each followed by the separator's
    ends: list[int]  # the index in `completion_ids` of each step's last token (where its label sits)


def separator_ids(tokenizer, separator: str) -> list[int]:
    ids = list(tokenizer.encode(separator, add_special_tokens=False))
    if not ids:
        raise ValueError(f"the step separator {separator!r} encodes to no token; a step's label needs one to sit on")
    return ids


def step_ids(tokenizer, prompt: str, steps: list[str], separator: str = DEFAULT_SEPARATOR) -> StepIds:
    """The prompt's ids and the steps' (TRL's tokenize_row, before truncation), with each step's end."""
    prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    if tokenizer.bos_token_id is not None:
        prompt_ids = [tokenizer.bos_token_id, *prompt_ids]
    sep = separator_ids(tokenizer, separator)
    completion, ends = [], []
    for step in steps:
        completion += [*tokenizer(bare_step(step, separator), add_special_tokens=False)["input_ids"], *sep]
        ends.append(len(completion) - 1)
    return StepIds(prompt_ids, completion, ends)


def bare_step(step: str, separator: str = DEFAULT_SEPARATOR) -> str:
    """A step's text without separators around it: blank lines a trace keeps with the step they precede (the
    step labels' rule) or a trailing separator, so a step encodes alike in training rows and in a scored reply."""
    while separator and step.startswith(separator):
        step = step[len(separator):]
    while separator and step.endswith(separator):
        step = step[: -len(separator)]
    return step


def split_steps(reply: str, separator: str = DEFAULT_SEPARATOR) -> list[str]:
    """A reply's steps: its text split on `separator`, pieces that hold only whitespace (a trailing separator's
    empty remainder, blank lines) left out."""
    return [piece for piece in reply.split(separator) if piece.strip()]
