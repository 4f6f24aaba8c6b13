"""`lmrl serve`: any model lmrl can load, behind an OpenAI-compatible chat-completions endpoint.

Routes: `POST /v1/chat/completions` (messages → the tokenizer's chat template → `HFEngine`
generation → an OpenAI `chat.completion` with `usage`), `GET /v1/models`, `GET /health`.
Built on the standard library's `ThreadingHTTPServer`; requests are parsed concurrently and
generation is serialised by a lock (one model, one forward pass at a time). It listens on the
loopback interface unless told otherwise, and has no authentication unless `api_key` is given,
so it is meant as a local judge or evaluation endpoint, not a public service.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from lmrl.engines import HFEngine, SamplingParams, eos_ids

MAX_BODY_BYTES = 8 * 1024 * 1024


class RequestError(ValueError):
    """A request the server refuses (HTTP 400), with a message saying which field is wrong."""


class ChatService:
    """Turns a chat-completion request body into a response body with one model and tokenizer."""

    def __init__(self, model, tokenizer, model_name: str = "lmrl", max_tokens_limit: int = 1024,
                 default_max_tokens: int = 256):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; lmrl serve needs one to format messages")
        self.tokenizer, self.model_name = tokenizer, model_name
        self.max_tokens_limit, self.default_max_tokens = max_tokens_limit, min(default_max_tokens, max_tokens_limit)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.engine = HFEngine(model, eos_ids(tokenizer, model), pad)
        self.lock = threading.Lock()
        self.created = int(time.time())

    def sampling(self, body: dict[str, Any]) -> tuple[SamplingParams, int, torch.Generator | None]:
        """Sampling params, number of choices and RNG from the OpenAI request fields."""
        def field(name: str, default):  # a missing field and an explicit null both mean the default
            return default if body.get(name) is None else body[name]

        max_tokens = field("max_completion_tokens", field("max_tokens", self.default_max_tokens))
        temperature, top_p, n = field("temperature", 1.0), field("top_p", 1.0), field("n", 1)
        checks = [("max_tokens", max_tokens, isinstance(max_tokens, int) and 1 <= max_tokens <= self.max_tokens_limit,
                   f"an integer in [1, {self.max_tokens_limit}]"),
                  ("temperature", temperature, isinstance(temperature, (int, float)) and 0 <= temperature <= 2,
                   "a number in [0, 2]"),
                  ("top_p", top_p, isinstance(top_p, (int, float)) and 0 < top_p <= 1, "a number in (0, 1]"),
                  ("n", n, isinstance(n, int) and 1 <= n <= 16, "an integer in [1, 16]")]
        for name, value, ok, expected in checks:
            if not ok or isinstance(value, bool):
                raise RequestError(f"'{name}' must be {expected} (got {value!r})")
        params = SamplingParams(max_new_tokens=max_tokens, temperature=float(temperature) or 1.0,
                                top_p=float(top_p), greedy=temperature == 0)
        seed = body.get("seed")
        generator = torch.Generator().manual_seed(int(seed)) if isinstance(seed, int) else None
        return params, n, generator

    def prompt_ids(self, messages: Any) -> list[int]:
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise RequestError(f"messages[{i}] must be an object with string 'role' and 'content'")
        ids = self.tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                                 add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)

    def complete(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if body.get("stream"):
            raise RequestError("'stream' is not supported; send stream=false")
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise RequestError("'stop' must be a string or a list of non-empty strings")
        prompt = self.prompt_ids(body.get("messages"))
        params, n, generator = self.sampling(body)
        with self.lock:
            completions = self.engine.generate([prompt], n, params, generator)[0]
        choices, generated = [], 0
        for index, c in enumerate(completions):
            text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            finish = c.finish_reason
            cut = min((text.find(s) for s in stops if s in text), default=-1)
            if cut >= 0:
                text, finish = text[:cut], "stop"
            generated += len(c.token_ids)
            choices.append({"index": index, "message": {"role": "assistant", "content": text},
                            "finish_reason": finish})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": generated,
                          "total_tokens": len(prompt) + generated}}

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "lmrl"}]}


def _handler(service: ChatService, api_key: str | None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: one line per request would drown a training log
            pass

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: HTTPStatus, message: str, kind: str) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status.value}})

        def _authorised(self) -> bool:
            if api_key is None or self.headers.get("Authorization") == f"Bearer {api_key}":
                return True
            self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong API key", "authentication_error")
            return False

        def do_GET(self):
            if self.path.rstrip("/") in ("/health", "/v1/health"):
                self._send(HTTPStatus.OK, {"status": "ok", "model": service.model_name})
            elif self.path.rstrip("/") == "/v1/models":
                if self._authorised():
                    self._send(HTTPStatus.OK, service.models())
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no route GET {self.path}", "not_found")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if 0 < length <= MAX_BODY_BYTES else b""
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(HTTPStatus.NOT_FOUND, f"no route POST {self.path}", "not_found")
                return
            if not self._authorised():
                return
            try:
                if length > MAX_BODY_BYTES:
                    self.close_connection = True
                    raise RequestError(f"request body over {MAX_BODY_BYTES} bytes")
                self._send(HTTPStatus.OK, service.complete(json.loads(raw or b"null")))
            except (RequestError, json.JSONDecodeError) as err:
                self._error(HTTPStatus.BAD_REQUEST, str(err), "invalid_request_error")
            except Exception as err:  # a generation failure must answer 500, not drop the connection
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(err).__name__}: {err}", "server_error")

    return Handler


def build_server(model, tokenizer, host: str = "127.0.0.1", port: int = 8000, model_name: str = "lmrl",
                 api_key: str | None = None, **service_options) -> ThreadingHTTPServer:
    """A ready (not yet serving) server; port 0 picks a free port (`server.server_address[1]`)."""
    service = ChatService(model, tokenizer, model_name=model_name, **service_options)
    server = ThreadingHTTPServer((host, port), _handler(service, api_key))
    server.daemon_threads = True
    server.service = service
    return server


def serve(model_path: str, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          api_key: str | None = None, device: str = "cpu", **service_options) -> None:
    """Load `model_path` ("default", a transformers directory or a .gguf file) and serve until interrupted."""
    from lmrl.models import load_model, load_tokenizer, resolve_model_path

    path = resolve_model_path(model_path)
    tokenizer = load_tokenizer(path)
    model = load_model(path).to(device)
    name = model_name or (model_path if model_path == "default" else path.name)
    server = build_server(model, tokenizer, host, port, name, api_key=api_key, **service_options)
    bound_host, bound_port = server.server_address[:2]
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        print(f"lmrl serve: warning: listening on {host} without an API key; anyone who can reach it can use it",
              flush=True)
    print(f"lmrl serve: model {name!r} on http://{bound_host}:{bound_port}/v1 (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
