"""Supervised datasets: records read from a file, a save_to_disk directory or the hub, their format, and each
record encoded as a `Sample` whose `loss_mask` marks the tokens to train (docs/stages/sft.md, "Datasets").

Formats, as TRL names them:

- `messages`: a conversation (`messages`, or ShareGPT `conversations`); the assistant turns are trained
  (`lmrl.data.conversations` computes which tokens those are).
- `prompt_completion`: `prompt` and `completion`, strings (plain text, concatenated, EOS appended) or
  messages (through the chat template; the prompt ends with the generation header); the completion is
  trained.
- `text`: plain language modelling; every token is trained, EOS appended.

Nothing predicts the first token of a sequence, so it is never trained; the prompt is at least that token.
- `preference`: `chosen` / `rejected`, with a `prompt` or sharing one (`encode_pair`: two Samples with
  the same prompt ids).
- `unpaired`: `prompt`, `completion` and a boolean `label` (KTO; `encode_unpaired`).
- `stepwise`: `prompt`, `completions` (a list of steps) and `labels` (one per step): a process reward model's
  rows, encoded by `data.steps`.

A record that leaves nothing to train (no assistant message, or nothing left within `max_tokens`) is not an
error: the encoder returns `Skipped(reason)`, which the caller counts and reports once per reason.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from lmrl.data.conversations import conversation, encode_conversation, tool_list
from lmrl.envs.tasks import TaskError, hf_records, read_jsonl
from lmrl.recipe_files import shipped_or_local
from lmrl.types import Origin, Sample

# format -> the fields its records have (the first key set found wins, in this order)
FORMATS: dict[str, tuple[str, ...]] = {
    "preference": ("chosen", "rejected"),
    "stepwise": ("prompt", "completions", "labels"),
    "unpaired": ("prompt", "completion", "label"),
    "prompt_completion": ("prompt", "completion"),
    "messages": ("messages",),
    "text": ("text",),
}
ALIASES = {"conversations": "messages"}  # ShareGPT's column, read as `messages`
NO_ASSISTANT = "had no assistant tokens to train on"
EMPTY = "had an empty completion"
NOTHING_LEFT = "had no trained token within max_tokens"


class Records(list):
    """A dataset's records (dicts), with where each came from for the errors: `where(i)` is "file:line" for a
    JSON-lines file, "source: row i" otherwise."""

    def __init__(self, records: list[dict[str, Any]], source: str, lines: list[int] | None = None):
        super().__init__(records)
        self.source, self.lines = source, lines

    def where(self, i: int) -> str:
        return f"{self.source}:{self.lines[i]}" if self.lines else f"{self.source}: row {i}"


def read_records(dataset: str, params: dict[str, Any] | None = None, key: str = "dataset") -> Records:
    """The records of a dataset (`shipped_or_local`): a JSON-lines file (read line by line, so errors name the
    line), a .json/.csv/.parquet file, a save_to_disk directory (a DatasetDict gives `params["split"]`, default
    "train") or a hub id (`params` `subset`, `revision`). `key` names the setting in the errors."""
    params = params or {}
    split = params.get("split", "train")
    path = shipped_or_local(dataset)
    if path.suffix == ".jsonl":
        if split != "train":
            raise TaskError(f"{path}: a JSON-lines file has one split, so there is no split {split!r}")
        records, lines = read_jsonl(path, key)
        out = Records(records, str(path), lines)
    else:
        records, source = hf_records(dataset, key, params, split)
        out = Records(records, source)
    if not out:
        raise TaskError(f"{out.source}: the dataset is empty")
    for i, rec in enumerate(out):
        if not isinstance(rec, dict):
            raise TaskError(f"{out.where(i)}: the record is a {type(rec).__name__}, not an object")
    return out


def _where(records: list, i: int) -> str:
    return records.where(i) if isinstance(records, Records) else f"row {i}"


def record_format(record: dict[str, Any]) -> str | None:
    """The format whose fields the record has (None-valued fields, which `datasets` fills in, do not count)."""
    present = {k for k, v in record.items() if v is not None}
    present |= {ALIASES[k] for k in present if k in ALIASES}
    return next((name for name, fields in FORMATS.items() if set(fields) <= present), None)


def detect_format(records: list[dict[str, Any]], fmt: str | None = None) -> str:
    """The records' format: `fmt` when given (checked against each record's fields), else the one their fields
    name, the same for every record. Errors name the record, the fields found and the formats accepted."""
    if fmt is not None and fmt not in FORMATS:
        raise TaskError(f"unknown dataset format {fmt!r}; formats: {', '.join(FORMATS)}")
    accepted = "; ".join(f"{name} ({', '.join(fields)})" for name, fields in FORMATS.items())
    found = fmt
    for i, rec in enumerate(records):
        if fmt is not None:
            missing = [f for f in FORMATS[fmt] if rec.get(f) is None and rec.get(_alias_of(f)) is None]
            if missing:
                raise TaskError(f"{_where(records, i)}: format {fmt} needs field(s) {missing}; found: {sorted(rec)}")
            continue
        this = record_format(rec)
        if this is None:
            raise TaskError(f"{_where(records, i)}: no known dataset format has fields {sorted(rec)}; accepted: "
                            f"{accepted}")
        if found is not None and this != found:
            raise TaskError(f"{_where(records, i)}: fields {sorted(rec)} are the {this} format, but the rows before "
                            f"are {found}; a dataset has one format (or set it explicitly)")
        found = this
    if found is None:
        raise TaskError("the dataset is empty")
    return found


def _alias_of(field: str) -> str | None:
    return next((alias for alias, name in ALIASES.items() if name == field), None)


@dataclass(frozen=True)
class Skipped:
    """A record that leaves nothing to train: not an error, counted and reported once per reason. Falsy, so
    `if encoded:` reads as for None."""

    reason: str

    def __bool__(self) -> bool:
        return False


def skipped_summary(reasons: Counter, max_tokens: int | None = None) -> str:
    """'3 rows had no assistant message to train on; 1 row had no trained token within max_tokens=64'."""
    parts = []
    for reason, n in sorted(reasons.items()):
        text = reason.replace("max_tokens", f"max_tokens={max_tokens}") if max_tokens else reason
        parts.append(f"{n} row{'s' if n != 1 else ''} {text}")
    return "; ".join(parts)


def is_chat(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def text_ids(tokenizer, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """A plain-text prompt and completion as TRL encodes them: the prompt tokenised, prompt + completion
    tokenised, EOS appended when missing, the completion trained from where the two diverge."""
    prompt_ids = list(tokenizer(prompt)["input_ids"])
    ids = list(tokenizer(prompt + completion)["input_ids"])
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
    shared = next((i for i, (a, b) in enumerate(zip(prompt_ids, ids)) if a != b), min(len(prompt_ids), len(ids)))
    return ids, [0] * shared + [1] * (len(ids) - shared)


def as_messages(value: Any, role: str, where: str) -> list[dict[str, Any]]:
    """A conversation, or a string as one message of `role` (a string prompt beside a conversational completion
    becomes a user message; a string completion beside a conversational prompt, an assistant message)."""
    return conversation(value, where) if is_chat(value) else [{"role": role, "content": str(value)}]


def prompt_completion_ids(tokenizer, record: dict[str, Any], prompt: Any, completion: Any, where: str,
                          assistant_only: bool = True) -> tuple[list[int], list[int]]:
    """Token ids and trained mask of a prompt and a completion: plain text when both are strings, through the
    chat template (the prompt as context) when either is a conversation."""
    if not is_chat(prompt) and not is_chat(completion):
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise TaskError(f"{where}: prompt and completion must be strings or lists of messages")
        return text_ids(tokenizer, prompt, completion)
    context = as_messages(prompt, "user", f"{where} field 'prompt'")
    reply = as_messages(completion, "assistant", f"{where} field 'completion'")
    return encode_conversation(tokenizer, context + reply, tool_list(record.get("tools"), where),
                               context=len(context), assistant_only=assistant_only)


def record_ids(tokenizer, record: dict[str, Any], fmt: str, where: str,
               assistant_only: bool = True) -> tuple[list[int], list[int]]:
    """Token ids and trained mask of a record of a supervised format (messages, prompt_completion, text)."""
    if fmt == "messages":
        messages = conversation(record.get("messages") or record.get("conversations"), f"{where} field 'messages'")
        return encode_conversation(tokenizer, messages, tool_list(record.get("tools"), where),
                                   assistant_only=assistant_only)
    if fmt == "prompt_completion":
        return prompt_completion_ids(tokenizer, record, record["prompt"], record["completion"], where, assistant_only)
    if fmt == "text":
        if not isinstance(record["text"], str):
            raise TaskError(f"{where}: field 'text' is a {type(record['text']).__name__}, not a string")
        return text_ids(tokenizer, "", record["text"])
    raise TaskError(f"{where}: format {fmt} is not a supervised format (messages, prompt_completion, text); "
                    "preference rows are encoded by encode_pair, unpaired ones by encode_unpaired")


def trained_text(tokenizer, ids: list[int], mask: list[int]) -> str:
    """The trained tokens decoded, each run of them on its own line (one line a turn)."""
    runs, current = [], []
    for token, trained in zip(ids, mask):
        if trained:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs += [current] if current else []
    return "\n".join(tokenizer.decode(run, skip_special_tokens=True) for run in runs)


def to_sample(tokenizer, ids: list[int], mask: list[int], record: dict[str, Any], max_tokens: int,
              prompt_len: int | None = None, info: dict[str, Any] | None = None,
              empty: str = NO_ASSISTANT) -> Sample | Skipped:
    """A Sample of the tokens kept within `max_tokens` (keeping the start): the prompt is every token before the
    first trained one (or the first `prompt_len`), the rest the completion with its loss mask. `empty`: the
    reason given when no token is trained at all."""
    mask = [0, *mask[1:]] if mask else mask  # nothing predicts the first token
    if not any(mask):
        return Skipped(empty)
    truncated = len(ids) > max_tokens
    ids, mask = ids[:max_tokens], mask[:max_tokens]
    if not any(mask):
        return Skipped(NOTHING_LEFT)
    cut = mask.index(1) if prompt_len is None else prompt_len
    completion, loss_mask = ids[cut:], mask[cut:]
    return Sample(prompt_ids=ids[:cut], completion_ids=completion, behaviour_logprobs=[0.0] * len(completion),
                  finish_reason="length" if truncated else "stop", info=dict(info or {}), origin=Origin.DATASET,
                  loss_mask=None if all(loss_mask) else loss_mask, text=trained_text(tokenizer, completion, loss_mask),
                  row=record)


def encode_sft(record: dict[str, Any], fmt: str, tokenizer, max_tokens: int, assistant_only: bool = True,
               where: str = "record") -> Sample | Skipped:
    """One supervised record (messages, prompt_completion or text) as a Sample, `Origin.DATASET`; `Skipped`
    when it leaves nothing to train. `assistant_only=False` trains every token of a conversation but the first."""
    ids, mask = record_ids(tokenizer, record, fmt, where, assistant_only)
    return to_sample(tokenizer, ids, mask, record, max_tokens, empty=_empty_reason(record, fmt))


def _empty_reason(record: dict[str, Any], fmt: str) -> str:
    return NO_ASSISTANT if fmt == "messages" or is_chat(record.get("completion")) else EMPTY


def implicit_prompt(chosen: Any, rejected: Any, where: str) -> tuple[Any, Any, Any]:
    """The prompt that full `chosen` and `rejected` sequences share, and what follows it in each (TRL's
    `extract_prompt`): the longest common prefix of messages, or of characters for strings (a space just
    before the first difference goes with the completions)."""
    if is_chat(chosen) != is_chat(rejected):
        raise TaskError(f"{where}: chosen and rejected must both be strings or both lists of messages")
    if is_chat(chosen):
        chosen = conversation(chosen, f"{where} field 'chosen'")
        rejected = conversation(rejected, f"{where} field 'rejected'")
    elif not isinstance(chosen, str) or not isinstance(rejected, str):
        raise TaskError(f"{where}: chosen and rejected must be strings or lists of messages")
    n = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
    if isinstance(chosen, str) and 0 < n < min(len(chosen), len(rejected)) and chosen[n - 1] == " ":
        n -= 1
    if n == 0:
        raise TaskError(f"{where}: chosen and rejected share no prompt (they differ from the start); give it in a "
                        "'prompt' field")
    if n in (len(chosen), len(rejected)):
        raise TaskError(f"{where}: one of chosen and rejected is the other's start (or they are equal), so one has "
                        "no completion")
    return chosen[:n], chosen[n:], rejected[n:]


def _margin(record: dict[str, Any], where: str) -> dict[str, float]:
    margin = record.get("margin")
    if margin is None:
        return {}
    if isinstance(margin, bool) or not isinstance(margin, (int, float)):
        raise TaskError(f"{where}: field 'margin' is {margin!r}, not a number")
    return {"margin": float(margin)}


def encode_pair(record: dict[str, Any], fmt: str, tokenizer, max_tokens: int, assistant_only: bool = True,
                where: str = "record") -> tuple[Sample, Sample] | Skipped:
    """A preference record as (chosen, rejected) Samples with identical `prompt_ids`, the prompt both share
    (the `prompt` field, or `implicit_prompt`); `info["preference"]` names the side, `info["margin"]` is the
    record's `margin` when it has one. `Skipped` when either side leaves nothing to train."""
    if fmt != "preference":
        raise TaskError(f"{where}: encode_pair reads the preference format, not {fmt}")
    if record.get("prompt") is not None:
        prompt, chosen, rejected = record["prompt"], record["chosen"], record["rejected"]
    else:
        prompt, chosen, rejected = implicit_prompt(record["chosen"], record["rejected"], where)
    sides = [prompt_completion_ids(tokenizer, record, prompt, c, f"{where} ({name})", assistant_only)
             for name, c in (("chosen", chosen), ("rejected", rejected))]
    if not all(any(mask) for _, mask in sides):
        return Skipped(NO_ASSISTANT if is_chat(chosen) else EMPTY)
    cut = min(mask.index(1) for _, mask in sides)
    (chosen_ids, _), (rejected_ids, _) = sides
    if chosen_ids[:cut] != rejected_ids[:cut]:
        raise TaskError(f"{where}: chosen and rejected tokenise their shared prompt differently (tokens merge across "
                        "its end); end the prompt on a token boundary")
    info = _margin(record, where)
    out = [to_sample(tokenizer, ids, mask, record, max_tokens, prompt_len=cut, info={**info, "preference": name})
           for (ids, mask), name in zip(sides, ("chosen", "rejected"))]
    skipped = next((x for x in out if isinstance(x, Skipped)), None)
    return skipped if skipped is not None else (out[0], out[1])


def encode_unpaired(record: dict[str, Any], tokenizer, max_tokens: int, assistant_only: bool = True,
                    where: str = "record") -> Sample | Skipped:
    """An unpaired record (KTO: `prompt`, `completion`, a boolean `label`) as a Sample with
    `info["desirable"]`."""
    label = record["label"]
    if not isinstance(label, bool) and label not in (0, 1):
        raise TaskError(f"{where}: field 'label' is {label!r}; expected true (desirable) or false (undesirable)")
    ids, mask = prompt_completion_ids(tokenizer, record, record["prompt"], record["completion"], where,
                                      assistant_only)
    return to_sample(tokenizer, ids, mask, record, max_tokens, info={"desirable": bool(label)},
                     empty=_empty_reason(record, "unpaired"))


def encode_records(records: list[dict[str, Any]], fmt: str, tokenizer, max_tokens: int,
                   assistant_only: bool = True) -> tuple[list[Sample | tuple[Sample, Sample]], Counter]:
    """Every record encoded by its format's encoder: Samples (pairs for the preference format) and the count of
    records skipped per reason (`skipped_summary`)."""
    kept, skipped = [], Counter()
    for i, record in enumerate(records):
        where = _where(records, i)
        if fmt == "preference":
            out = encode_pair(record, fmt, tokenizer, max_tokens, assistant_only, where)
        elif fmt == "unpaired":
            out = encode_unpaired(record, tokenizer, max_tokens, assistant_only, where)
        else:
            out = encode_sft(record, fmt, tokenizer, max_tokens, assistant_only, where)
        if isinstance(out, Skipped):
            skipped[out.reason] += 1
        else:
            kept.append(out)
    return kept, skipped
