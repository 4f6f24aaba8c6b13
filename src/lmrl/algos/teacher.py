"""Distillation from a privileged-context teacher: the policy itself, shown something the student was not.

A teacher context (registry `TEACHER_CONTEXTS`, chosen by the `distill` term's `context` setting in
`algo.terms`) is built once per run from its `context_params` (`build_teacher`) and called on each batch as `context(samples, rows, correct)`: the scored
samples, their task rows and whether each one's accuracy reward is 1. It returns, per sample, None (no
teacher) or a text the teacher prompt gets beyond the student's. The learner side
(`lmrl.inputs.teacher`) scores each completion under that prompt; the objective adds
`coef · estimator(log π, log π_teacher)` on the tokens `distill_mask` selects (docs/methods/hindsearch.md).
The contexts that call a judge register from `lmrl.rewards` (`rewards/hindsight_critique.py`): this
module stays pure.
"""
from __future__ import annotations

from typing import Any

import torch

from lmrl.algos.kl import k3
from lmrl.registry import KnobError, Registry
from lmrl.types import Sample

TEACHER_CONTEXTS: Registry = Registry("teacher context")
DISTILL_INPUTS = frozenset({"teacher_logp", "teacher_mask"})
TOOL_CALL = "<tool_call>"


def k1_distill(logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Value k1 = log π − log π_T; gradient k1 · ∇log π (the reverse KL's score-function form, per token).

    The plain k1 as a loss has gradient ∇log π whatever the teacher says; this form pulls log π down
    where it is above the teacher's and up where it is below."""
    d = (logp - teacher_logp).detach()
    return d + d * (logp - logp.detach())


DISTILL_ESTIMATORS = {"k1": k1_distill, "k3": k3}
DISTILL_TOKENS = ("all", "tool_calls")  # every policy token, or only turns whose reply has a <tool_call>
# the `distill` term's settings and their defaults: which context, its knobs, which tokens are distilled
TEACHER_SETTINGS = {"context": "hindsight_critique", "context_params": {}, "tokens": "all"}


def build_teacher(context: str, context_params: dict[str, Any], **_: Any):
    """The teacher context of a run, built once from its registered name and knobs."""
    return TEACHER_CONTEXTS.get(context)(**context_params)


def check_teacher(cfg, context: str, context_params: dict[str, Any], tokens: str, estimator: str = "k1") -> str | None:
    """Why the distill term cannot run (an unknown context, knob, token choice or estimator), or None."""
    if estimator not in DISTILL_ESTIMATORS:
        return f"estimator must be one of {sorted(DISTILL_ESTIMATORS)} (got {estimator!r})"
    if context not in TEACHER_CONTEXTS:
        return f"context: {TEACHER_CONTEXTS.unknown_message(context)}"
    if tokens not in DISTILL_TOKENS:
        return f"tokens must be one of {list(DISTILL_TOKENS)} (got {tokens!r})"
    try:
        TEACHER_CONTEXTS.check_knobs(context, context_params)
    except KnobError as err:
        return f"context_params: {err}"
    return None


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, length) of each run of 1s."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def policy_turns(sample: Sample) -> list[tuple[int, int, str]]:
    """(start, length, reply) of each trained policy turn: the runs of `loss_mask` == 1, matched in order
    with the episode's replies (`info["messages"]`) that kept tokens in the loss."""
    if sample.loss_mask is None:
        return [(0, len(sample.completion_ids), sample.text)]
    info = sample.info
    replies = [m["content"] for m in info.get("messages", []) if m["role"] == "assistant"]
    replies = replies[len(replies) - info.get("turns", len(replies)):]
    lengths = info.get("turn_lengths") or [1] * len(replies)
    eligible = info.get("turn_eligible") or [True] * len(replies)
    kept = [r for r, n, ok in zip(replies, lengths, eligible) if ok and n > 0]
    runs = _runs(sample.loss_mask)
    if len(runs) != len(kept):
        raise ValueError(f"a sample has {len(runs)} runs of policy tokens but {len(kept)} trained replies in "
                         "info['messages']; its turns cannot be told apart")
    return [(start, n, reply) for (start, n), reply in zip(runs, kept)]


def distill_mask(sample: Sample, tokens: str) -> list[int]:
    """Per completion token, 1 where the distillation term applies: every policy token (`all`), or the
    tokens of policy turns whose reply contains a tool call (`tool_calls`); environment tokens never."""
    if tokens == "all":
        return list(sample.loss_mask) if sample.loss_mask is not None else [1] * len(sample.completion_ids)
    mask = [0] * len(sample.completion_ids)
    for start, length, reply in policy_turns(sample):
        if TOOL_CALL in reply:
            mask[start:start + length] = [1] * length
    return mask


def opening_end(sample: Sample) -> int:
    """Index in `info["messages"]` of the first policy reply (the opening chat is everything before it)."""
    messages = sample.info.get("messages") or []
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    turns = sample.info.get("turns", len(assistant))
    return assistant[len(assistant) - turns] if turns else len(messages)


def trajectory_text(sample: Sample) -> str:
    """What the policy did: its replies and the environment's answers, one `[role] content` per message
    (a single-turn sample: its completion text)."""
    messages = sample.info.get("messages")
    if not messages:
        return sample.text
    return "\n".join(f"[{m['role']}] {m['content']}" for m in messages[opening_end(sample):])


def with_context(messages: list[dict[str, Any]], context: str) -> list[dict[str, Any]]:
    """The opening chat with `context` appended to its last user message after a blank line (a user
    message holding only `context` is added when there is none)."""
    out = [dict(m) for m in messages]
    users = [i for i, m in enumerate(out) if m["role"] == "user"]
    if not users:
        return [*out, {"role": "user", "content": context}]
    out[users[-1]]["content"] = f"{out[users[-1]]['content']}\n\n{context}"
    return out
