"""Chat-template token ids of an episode: its opening prompt, and each observation as a continuation.

The policy's tokens are never re-tokenised: after a policy turn, only the environment's tokens are
encoded and appended. They are the chat template's continuation of the conversation, computed as a
difference of two renderings of a fixed placeholder conversation (so the result does not depend on
how the policy's own text would re-render):

    A = template([user P, assistant Q])                        the assistant turn closed
    B = template([user P, assistant Q, *observation], add_generation_prompt=True)

B must start with A (checked; a template that rewrites earlier turns cannot be continued this way
and is refused with an error). The environment's text is then what the template writes after the
assistant's content that the policy has not written itself, followed by B − A:

    closing = the text of A after Q (e.g. "<|im_end|>\\n")
    env text = closing minus the policy's last token when that token starts it (it ended its turn
               with the template's end-of-turn), else the whole closing (a turn cut at the token limit)
               + B[len(A):]                 (e.g. "<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n")

A tokenizer without a chat template uses the plain-text convention of single-turn prompts: each
message's content on its own line.
"""
from __future__ import annotations

import json
from typing import Any

USER, ASSISTANT = "lmrl placeholder question", "lmrl placeholder reply"


class TemplateError(ValueError):
    """A chat template that cannot render an observation as a continuation of the conversation."""


def supports_tools(tokenizer) -> bool:
    """Whether the chat template renders a `tools=` list itself."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def with_tool_schemas(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lmrl convention for a template without tool support: the schemas, one JSON object a line in
    `<tools></tools>`, at the end of the system message (a system message is added when there is none)."""
    block = "You can call these tools:\n<tools>\n" + "\n".join(json.dumps(t) for t in tools) + "\n</tools>"
    out = [dict(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{block}"
        return out
    return [{"role": "system", "content": block}, *out]


def _ids(encoded) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    return list(encoded)


def encode_opening(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of an episode's opening chat, ending with the assistant header."""
    if tools and not supports_tools(tokenizer):
        messages = with_tool_schemas(messages, tools)
    if not getattr(tokenizer, "chat_template", None):
        text = "\n".join(m["content"] for m in messages) + "\n"
        return tokenizer(text, add_special_tokens=True)["input_ids"]
    extra = {"tools": tools} if tools else {}
    return _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra))


def _render(tokenizer, messages: list[dict[str, Any]], generation: bool) -> str:
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)
    except Exception as err:  # jinja raises its own errors for roles a template does not know
        roles = ", ".join(m["role"] for m in messages[2:])
        raise TemplateError(f"the chat template cannot render an observation with roles [{roles}]: {err}; "
                            "use roles the template knows (e.g. 'user')") from err


def observation_text(tokenizer, observation: list[dict[str, Any]], last_token: int | None) -> str:
    """The environment's text after a policy turn whose last sampled token is `last_token` (None: the turn
    was cut at the token limit before it ended)."""
    if not getattr(tokenizer, "chat_template", None):
        return "\n" + "\n".join(m["content"] for m in observation) + "\n"
    head = [{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT}]
    closed = _render(tokenizer, head, generation=False)
    continued = _render(tokenizer, head + observation, generation=True)
    if not continued.startswith(closed) or ASSISTANT not in closed:
        raise TemplateError("the chat template does not render a new message as a continuation of the "
                            "conversation (it rewrites earlier turns), so observations cannot be appended "
                            "token-in-token-out")
    closing = closed[closed.rindex(ASSISTANT) + len(ASSISTANT):]
    if last_token is not None:
        ended = tokenizer.decode([last_token], skip_special_tokens=False)
        if ended and closing.startswith(ended):
            closing = closing[len(ended):]
    return closing + continued[len(closed):]


def observation_ids(tokenizer, observation: list[dict[str, Any]], last_token: int | None) -> list[int]:
    """Token ids of `observation_text`: the environment's tokens, context only (never trained)."""
    ids = tokenizer(observation_text(tokenizer, observation, last_token), add_special_tokens=False)["input_ids"]
    if not ids:
        raise TemplateError("an observation encoded to no tokens")
    return list(ids)
