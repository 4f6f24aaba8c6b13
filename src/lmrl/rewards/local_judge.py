"""A judge (or GenAC critic) that is a local model, generating in this process instead of behind an endpoint.

`LocalJudgeClient` is a `JudgeClient` whose requests go to a `ChatService` (`lmrl.serve`, what `lmrl serve`
answers with) built on first use from `model_path` — a transformers directory, a LoRA adapter directory,
`default`, or a pipeline stage's final weights (`{from: <label>}`) — instead of over HTTP. Caching, request
fields, `chat_many` and the parsers are the client's own, so a recipe switches between a served and a local
judge by giving `model_path` in place of `base_url`; `timeout_s` bounds how long a request waits for its turn
on the model, `max_concurrency` how many are batched together. The model is loaded once, frozen: it is the weights at
`model_path` when the run starts, not the policy as it trains.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from lmrl.rewards.judge_client import JudgeClient, JudgeResponseError


@dataclass
class LocalJudgeClient(JudgeClient):
    model_path: str = ""  # the model to load (see `lmrl.serve.load_served_model`)
    device: str = "cpu"  # where it generates (auto | cpu | cuda | cuda:N)
    max_new_tokens_limit: int = 1024  # the service's cap on max_tokens

    def __post_init__(self):
        if not self.model_path:
            raise ValueError("a local judge needs model_path (a model directory, `default`, or {from: <stage>})")
        self.base_url = f"local:{self.model_path}"
        super().__post_init__()
        self._service, self._load_lock = None, threading.Lock()

    def service(self):
        """The `ChatService` over the model, loaded on first use."""
        with self._load_lock:
            if self._service is None:
                from lmrl.models.device import resolve_device
                from lmrl.serve import ChatService, load_served_model

                model, tokenizer, _ = load_served_model(self.model_path)
                model = model.to(resolve_device(self.device)).eval()
                self._service = ChatService(model, tokenizer, model_name=self.model,
                                            max_tokens_limit=self.max_new_tokens_limit, queue_timeout_s=self.timeout_s)
            return self._service

    def _post_with_retries(self, body: dict[str, Any]) -> dict[str, Any]:
        self._count("requests")
        reply = self.service().complete(body)
        if not reply.get("choices"):
            raise JudgeResponseError(f"local judge {self.model_path}: no choices in its reply")
        return reply
