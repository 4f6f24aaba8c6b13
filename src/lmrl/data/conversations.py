"""Token ids of a conversation and which of them are trained: the assistant turns, through the chat template.

The conversation is rendered once and tokenised as a whole (the ids `apply_chat_template(tokenize=True)`
gives). Which characters are trained comes from one of two places:

- a template with `{% generation %}…{% endgeneration %}` blocks marks them itself (transformers'
  `return_assistant_tokens_mask`, what TRL's `assistant_only_loss` reads);
- any other template is rendered on prefixes of the conversation, as `lmrl.envs.chat` computes the
  continuations of an episode. For the assistant message i,

      before = template(messages[:i], add_generation_prompt=True)   ends with the assistant header
      after  = template(messages[:i + 1])                            the turn closed

  and the turn's characters are after[len(before):] without the whitespace the template writes after
  its end-of-turn token: the reply and that token ("…<|im_end|>", not the "\\n" after it), what the
  model produces before it stops. Each rendering must start with the one before it and the whole
  conversation must start with each of them; a template that rewrites earlier turns (one that drops
  the reasoning of past turns, say) cannot be split this way and is refused with an error.

A token is trained when one of its characters is. Messages before `context` (the prompt of a
prompt–completion row) are never trained. With `assistant_only=False` every token after the context
is trained.

A tokenizer without a chat template uses lmrl's plain-text convention of episodes (`lmrl.envs.chat`):
the opening messages one a line, each assistant reply followed by EOS, the other messages after it as
"\\n" + one a line + "\\n"; the pieces are tokenised apart, as a rollout would produce them.
"""
from __future__ import annotations

import json
import re
from typing import Any

from lmrl.envs.chat import TemplateError, encode_opening, observation_text, supports_tools, with_tool_schemas
from lmrl.envs.tasks import TaskError, chat_message

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}  # ShareGPT `from` values that are not chat roles


def conversation(value: Any, where: str) -> list[dict[str, Any]]:
    """Validate a conversation: a non-empty list of chat messages (`lmrl.envs.tasks.chat_message`). ShareGPT
    messages (`from` / `value`, TRL's `conversations` column) are read as `role` / `content`."""
    if not isinstance(value, (list, tuple)) or not value:
        raise TaskError(f"{where}: a conversation must be a non-empty list of {{role, content}} messages")
    out = []
    for j, msg in enumerate(value):
        if isinstance(msg, dict) and "from" in msg and "role" not in msg:
            msg = {k: v for k, v in msg.items() if k not in ("from", "value")} | {
                "role": SHAREGPT_ROLES.get(msg["from"], msg["from"]), "content": msg.get("value")}
        out.append(chat_message(msg, f"{where}: message {j}"))
    return out


def tool_list(value: Any, where: str) -> list[dict[str, Any]] | None:
    """A row's `tools` column (a list of schemas, or that list as a JSON string), for the chat template."""
    if value is None or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise TaskError(f"{where}: field 'tools' is not valid JSON ({err.msg})") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise TaskError(f"{where}: field 'tools' must be a list of tool schemas (objects)")
    return value


def has_generation_blocks(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and GENERATION_BLOCK.search(template) is not None


def render(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None, generation: bool) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation, tokenize=False)
    except Exception as err:  # jinja raises its own errors for conversations a template refuses
        roles = ", ".join(m["role"] for m in messages)
        raise TemplateError(f"the chat template cannot render the conversation [{roles}]: {err}") from err


def _starts(longer: str, shorter: str, what: str) -> None:
    if not longer.startswith(shorter):
        raise TemplateError(f"the chat template renders {what} differently once more messages follow (it rewrites "
                            "earlier turns), so the assistant turns cannot be told apart by rendering prefixes; use "
                            "a template that does not, or one with {% generation %} blocks")


def prefix_spans(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                 first: int = 0) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns from message `first` on, by
    rendering prefixes (the module docstring)."""
    full = render(tokenizer, messages, tools, generation=False)
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant" or i < first:
            continue
        before = render(tokenizer, messages[:i], tools, generation=True)
        after = render(tokenizer, messages[: i + 1], tools, generation=False)
        _starts(after, before, f"the conversation before assistant message {i}")
        _starts(full, after, f"the conversation up to assistant message {i}")
        spans.append((len(before), max(len(before), len(after.rstrip()))))
    return full, spans


def _offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    if not getattr(tokenizer, "is_fast", False):
        raise TemplateError("the assistant-token mask maps characters to tokens, which needs a fast tokenizer "
                            f"({type(tokenizer).__name__} is not one)")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _marked_mask(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None, ids: list[int]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    if list(out["input_ids"]) != ids:
        raise TemplateError("the chat template's tokenised rendering differs from the rendered text tokenised")
    return list(out["assistant_masks"])


def _templated(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None, context: int,
               assistant_only: bool) -> tuple[list[int], list[int]]:
    full = render(tokenizer, messages, tools, generation=False)
    start = 0
    if context:
        opening = render(tokenizer, messages[:context], tools, generation=True)
        _starts(full, opening, "the prompt")
        start = len(opening)
    ids, offsets = _offsets(tokenizer, full)
    after_context = [1 if begin >= start else 0 for begin, _ in offsets]
    if not assistant_only:
        return ids, after_context
    if has_generation_blocks(tokenizer):
        marked = _marked_mask(tokenizer, messages, tools, ids)
        return ids, [m & c for m, c in zip(marked, after_context)]
    _, spans = prefix_spans(tokenizer, messages, tools, first=context)
    mask = [1 if any(b < span_end and e > span_start for span_start, span_end in spans) else 0
            for b, e in offsets]
    return ids, mask


def plain_reply(message: dict[str, Any]) -> str:
    """An assistant message as plain text: its content, then each tool call as <tool_call>{json}</tool_call>
    (the format lmrl's tool environments parse)."""
    calls = [c.get("function", c) if isinstance(c, dict) else c for c in message.get("tool_calls", ())]
    return message["content"] + "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)


def _plain(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None, context: int,
           assistant_only: bool) -> tuple[list[int], list[int]]:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    head = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    if head:
        ids = list(encode_opening(tokenizer, messages[:head], tools))
    else:
        ids = list(tokenizer("", add_special_tokens=True)["input_ids"])
    mask = [0 if head <= context or assistant_only else 1] * len(ids)
    i = head
    while i < len(messages):
        if messages[i]["role"] == "assistant":
            piece = list(tokenizer(plain_reply(messages[i]), add_special_tokens=False)["input_ids"]) + eos
            trained, i = i >= context, i + 1
        else:
            end = next((j for j in range(i, len(messages)) if messages[j]["role"] == "assistant"), len(messages))
            text = observation_text(tokenizer, messages[i:end], None)
            piece = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            trained, i = not assistant_only and i >= context, end
        ids += piece
        mask += [int(trained)] * len(piece)
    return ids, mask


def encode_conversation(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                        context: int = 0, assistant_only: bool = True) -> tuple[list[int], list[int]]:
    """The conversation's token ids and, per token, 1 where it is trained (the module docstring)."""
    if tools and not supports_tools(tokenizer):
        with_schemas = with_tool_schemas(messages, tools)
        context += len(with_schemas) - len(messages) if context else 0
        messages, tools = with_schemas, None
    encode = _templated if getattr(tokenizer, "chat_template", None) else _plain
    return encode(tokenizer, messages, tools, context, assistant_only)
