"""A distillation teacher served over HTTP: the `teacher_kl` term's teacher given as an OpenAI-compatible
completions endpoint (`lmrl serve`, or `vllm serve`) instead of a model loaded into the run.

Each row's exact token ids (prompt + completion) go to `POST {base_url}/completions` with `echo: true`,
`max_tokens: 0` and `logprobs: 1`; the reply's `token_logprobs` are the teacher's log-probs of those very tokens,
each given its prefix (the first is null), nothing re-tokenised. A request holds `rows_per_request` rows and at
most `max_concurrency` are in flight; each has the judge client's timeout, retries and backoff
(`rewards.judge_client`), and a call that fails for good fails the step with the endpoint's error, never a zero.
The ids must mean the same on both sides: each token of every reply is checked against the student's tokenizer
(the reply's `tokens` are each id's text), as the in-process teacher compares vocabularies. The log-probs are
the teacher's own distribution (temperature 1): OpenAI-compatible servers apply no temperature to an echoed prompt.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
import torch

from lmrl.rewards.judge_client import JudgeClient, JudgeResponseError, reply_json
from lmrl.types import Batch

ENDPOINT_DEFAULTS: dict[str, Any] = {"base_url": None, "model": "default", "api_key_env": None, "timeout_s": 120.0,
                                     "retries": 3, "backoff_s": 0.5, "max_concurrency": 4, "rows_per_request": 8}
LIMITS = {"timeout_s": ("a number > 0", lambda v: isinstance(v, (int, float)) and v > 0),
          "backoff_s": ("a number >= 0", lambda v: isinstance(v, (int, float)) and v >= 0),
          "retries": ("an integer >= 0", lambda v: isinstance(v, int) and v >= 0),
          "max_concurrency": ("an integer >= 1", lambda v: isinstance(v, int) and v >= 1),
          "rows_per_request": ("an integer >= 1", lambda v: isinstance(v, int) and v >= 1)}
ROLE = "the teacher_kl term's teacher"


def check_endpoint(endpoint: Any) -> str | None:
    """Why `endpoint` (the term's `params.endpoint`) cannot reach a teacher, or None."""
    if not isinstance(endpoint, dict):
        return f"endpoint must be a mapping with base_url (and model, ...), got {endpoint!r}"
    unknown = sorted(set(endpoint) - set(ENDPOINT_DEFAULTS))
    if unknown:
        return f"endpoint: unknown key(s) {unknown}; its keys: {', '.join(ENDPOINT_DEFAULTS)}"
    url = endpoint.get("base_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return f"endpoint.base_url must be the server's http(s) URL, e.g. http://127.0.0.1:8000/v1 (got {url!r})"
    for key, (meaning, ok) in LIMITS.items():
        value = endpoint.get(key, ENDPOINT_DEFAULTS[key])
        if isinstance(value, bool) or not ok(value):
            return f"endpoint.{key} must be {meaning} (got {value!r})"
    return None


class ServedTeacher:
    """The teacher behind an OpenAI-compatible `/v1/completions` endpoint (the term's `endpoint` mapping)."""

    def __init__(self, endpoint: dict[str, Any]):
        problem = check_endpoint(endpoint)
        if problem:
            raise ValueError(problem)
        knobs = {**ENDPOINT_DEFAULTS, **endpoint}
        self.rows_per_request = knobs.pop("rows_per_request")
        self.client = JudgeClient(cache=False, **knobs)
        self.url = self.client.base_url.rstrip("/") + "/completions"
        self._agreed: set[int] = set()  # token ids whose text the teacher and the student's tokenizer agree on

    def logprobs(self, batch: Batch, learner, tokenizer) -> torch.Tensor:
        """[B, T-1] the teacher's log-prob of each generated token of the batch's rows (0 elsewhere), on the CPU."""
        lengths = batch.attention_mask.sum(1).tolist()
        rows = [batch.input_ids[r, : int(n)].tolist() for r, n in enumerate(lengths)]
        chunks = [rows[i: i + self.rows_per_request] for i in range(0, len(rows), self.rows_per_request)]
        out = torch.zeros_like(batch.completion_mask)
        if not chunks:
            return out
        with ThreadPoolExecutor(max_workers=min(self.client.max_concurrency, len(chunks))) as pool:
            replies = [choice for reply in pool.map(self._score, chunks) for choice in reply]
        for r, (ids, (tokens, logprobs)) in enumerate(zip(rows, replies)):
            self._check_tokens(ids, tokens, tokenizer)
            out[r, : len(ids) - 1] = torch.tensor(logprobs[1:], dtype=out.dtype)
        return out * (batch.completion_mask > 0)

    def _score(self, rows: list[list[int]]) -> list[tuple[list[str], list[float | None]]]:
        body = {"model": self.client.model, "prompt": rows, "echo": True, "max_tokens": 0, "logprobs": 1}
        return self.client.post("/completions", body, lambda response: scored_rows(response, rows), what=ROLE)

    def _check_tokens(self, ids: list[int], tokens: list[str], tokenizer) -> None:
        for token_id, text in zip(ids, tokens):
            if token_id in self._agreed:
                continue
            ours = token_texts(tokenizer, token_id)
            if text not in ours:
                raise ValueError(f"{ROLE} at {self.url} gives token id {token_id} the text {text!r}, the student's "
                                 f"tokenizer {ours[0]!r}: token-level distillation needs the same vocabulary (serve a "
                                 "teacher with the student's tokenizer)")
            self._agreed.add(token_id)


def token_texts(tokenizer, token_id: int) -> list[str]:
    """The texts a server may give one token id: decoded alone (lmrl serve, vLLM), the vocabulary's token and
    its string form, or vLLM's `token_id:N` (`--return-tokens-as-token-ids`)."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    return [tokenizer.decode([token_id]), tokenizer.convert_tokens_to_string([piece]), piece, f"token_id:{token_id}"]


def scored_rows(response: requests.Response, rows: list[list[int]]) -> list[tuple[list[str], list[float | None]]]:
    """Each row's (token texts, token log-probs) from a `text_completion` reply to echoed `rows`, in the rows'
    order; `JudgeResponseError` for a reply that does not score each token of each row (retried)."""
    reply = reply_json(response, "a text completion")
    try:
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        scored = [(c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"]) for c in choices]
    except (KeyError, TypeError):
        raise JudgeResponseError(f"not a text completion with logprobs: {response.text[:200]!r}") from None
    if len(scored) != len(rows):
        raise JudgeResponseError(f"{len(scored)} choices for {len(rows)} prompts")
    for ids, (tokens, logprobs) in zip(rows, scored):
        if not (isinstance(tokens, list) and isinstance(logprobs, list) and len(tokens) == len(logprobs) == len(ids)):
            raise JudgeResponseError(f"the echoed prompt of {len(ids)} tokens came back with "
                                     f"{len(logprobs) if isinstance(logprobs, list) else 'no'} log-probs")
        if not all(isinstance(lp, (int, float)) and not isinstance(lp, bool) and not math.isnan(lp) and lp <= 0
                   for lp in logprobs[1:]):
            raise JudgeResponseError(f"token log-probs that are not numbers <= 0: {str(logprobs)[:200]}")
    return scored
