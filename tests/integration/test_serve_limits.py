"""`lmrl serve` under load, with a tiny random model (context 512): prompts beyond the context are refused,
concurrent requests share one generate call in arrival order, a full or slow queue answers 429 / 503,
and a LoRA run's checkpoint (adapters only) is served on its base."""
import threading
import time

import pytest
import requests
import torch

from conftest import make_tokenizer, toy_run_config, toy_run_on_disk
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.serve import build_server, load_served_model

CONTEXT = 512  # tiny_llama's max_position_embeddings


class Gate:
    """Holds the engine's next generate call until `open()`; records the prompts of every call."""

    def __init__(self, engine):
        self.calls: list[int] = []
        self.entered, self.released = threading.Event(), threading.Event()
        self._generate = engine.generate
        engine.generate = self

    def __call__(self, prompts, n, params, generator=None):
        self.calls.append(len(prompts))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.released.wait(30)
        return self._generate(prompts, n, params, generator)

    def open(self):
        self.released.set()


@pytest.fixture
def serve_tiny():
    servers = []

    def start(**options):
        tok = make_tokenizer()
        srv = build_server(tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tok, port=0, model_name="tiny",
                           max_tokens_limit=64, **options)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def post(srv, body, timeout=60):
    return requests.post(f"http://127.0.0.1:{srv.server_address[1]}/v1/chat/completions", json=body, timeout=timeout)


def chat(text, **fields):
    return {"messages": [{"role": "user", "content": text}], **fields}


def in_background(fn, *args):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn(*args)), daemon=True)
    thread.start()
    return thread, out


def wait_until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_prompt_beyond_the_context_is_refused_before_generation(serve_tiny):
    srv = serve_tiny()
    gate = Gate(srv.service.engine)
    gate.open()
    text = "a" * 600  # one token per character: 600 + the chat template's tokens > 512
    prompt_tokens = len(srv.service.prompt_ids(chat(text)["messages"]))
    reply = post(srv, chat(text, max_tokens=8))
    assert reply.status_code == 400 and gate.calls == []
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "context_length_exceeded",
                                                              "messages")
    assert f"maximum context length is {CONTEXT} tokens" in error["message"]
    assert f"{prompt_tokens} in the messages" in error["message"]


def test_prompt_plus_max_tokens_must_fit_and_the_default_shrinks_to_the_room_left(serve_tiny):
    srv = serve_tiny()
    messages = chat("b" * 490)["messages"]
    prompt_tokens = len(srv.service.prompt_ids(messages))
    room = CONTEXT - prompt_tokens
    assert 0 < room < 30  # the prompt leaves less room than 30 tokens
    refused = post(srv, {"messages": messages, "max_tokens": room + 1})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "max_tokens")
    assert f"requested {CONTEXT + 1} tokens" in error["message"]
    fits = post(srv, {"messages": messages, "max_tokens": room})
    assert fits.status_code == 200
    default = post(srv, {"messages": messages, "temperature": 1.0, "seed": 1})  # default max_tokens 64 > room
    assert default.status_code == 200
    usage = default.json()["usage"]
    assert usage["prompt_tokens"] == prompt_tokens and usage["total_tokens"] <= CONTEXT


def test_concurrent_requests_share_one_generate_call_in_arrival_order(serve_tiny):
    srv = serve_tiny()
    texts = ["say 7", "q1 say 7", "abc", "12+3=?", "x"]
    alone = {t: post(srv, chat(t, temperature=0, max_tokens=10)).json()["choices"][0]["message"]["content"]
             for t in texts}
    gate = Gate(srv.service.engine)
    first, first_out = in_background(post, srv, chat("hold", temperature=0, max_tokens=10))
    assert gate.entered.wait(10)
    waiting = []
    for t in texts:  # they arrive while the first generation runs, and wait
        waiting.append((t, *in_background(post, srv, chat(t, temperature=0, max_tokens=10))))
        wait_until(lambda: srv.service.queue.waiting == len(waiting))
    gate.open()
    for t, thread, out in [("hold", first, first_out), *waiting]:
        thread.join(30)
        assert out["value"].status_code == 200
    assert gate.calls == [1, len(texts)]  # the five waiting requests: one batched call
    for t, _, out in waiting:
        assert out["value"].json()["choices"][0]["message"]["content"] == alone[t]
    assert srv.service.queue.stats["largest_batch"] == len(texts)


def test_requests_that_cannot_share_a_call_are_served_first_come_first_served(serve_tiny):
    srv = serve_tiny()
    gate = Gate(srv.service.engine)
    first, _ = in_background(post, srv, chat("hold", max_tokens=4))
    assert gate.entered.wait(10)
    bodies = [chat("a", max_tokens=5, seed=1), chat("b", max_tokens=6), chat("a", max_tokens=5, seed=1),
              chat("d", max_tokens=6)]
    threads = []
    for body in bodies:
        threads.append(in_background(post, srv, body))
        wait_until(lambda: srv.service.queue.waiting == len(threads))
    gate.open()
    for thread, out in [(first, None), *threads]:
        thread.join(30)
    # seeded requests keep their own generator (one call each, the same reply); "b" and "d" share one call,
    # taken at b's turn, before the second seeded request
    assert gate.calls == [1, 1, 2, 1]
    seeded = [threads[i][1]["value"].json()["choices"][0]["message"]["content"] for i in (0, 2)]
    assert seeded[0] == seeded[1]
    assert all(out["value"].status_code == 200 for _, out in threads)


def test_a_request_that_waits_past_the_queue_timeout_gets_503(serve_tiny):
    srv = serve_tiny(queue_timeout_s=0.3)
    gate = Gate(srv.service.engine)
    first, first_out = in_background(post, srv, chat("hold", max_tokens=4))
    assert gate.entered.wait(10)
    started = time.monotonic()
    late = post(srv, chat("late", max_tokens=4))
    waited = time.monotonic() - started
    assert late.status_code == 503 and late.headers["Retry-After"] == "1"
    assert late.json()["error"]["code"] == "queue_timeout" and 0.3 <= waited < 5
    gate.open()
    first.join(30)
    assert first_out["value"].status_code == 200  # the running generation was not interrupted
    assert srv.service.queue.waiting == 0 and srv.service.queue.stats["timed_out"] == 1
    assert post(srv, chat("after", max_tokens=4)).status_code == 200


def test_a_full_queue_refuses_at_once_with_429(serve_tiny):
    srv = serve_tiny(max_queue=1)
    gate = Gate(srv.service.engine)
    first, _ = in_background(post, srv, chat("hold", max_tokens=4))
    assert gate.entered.wait(10)
    second, second_out = in_background(post, srv, chat("queued", max_tokens=4))
    wait_until(lambda: srv.service.queue.waiting == 1)
    refused = post(srv, chat("third", max_tokens=4), timeout=5)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    gate.open()
    for thread in (first, second):
        thread.join(30)
    assert second_out["value"].status_code == 200 and gate.calls == [1, 1]


def test_a_lora_run_checkpoint_is_served_with_its_adapters(tmp_path):
    disk = toy_run_on_disk(tmp_path)
    cfg = toy_run_config(tmp_path, 1, model={**disk["model"], "lora": {"r": 4, "alpha": 8.0}},
                         reward=disk["reward"])
    tok = make_tokenizer()
    stages = build_stages(cfg)
    result = train(cfg, stages=stages)
    adapters = result.run_dir / "checkpoints" / "step-000001" / "model"
    assert (adapters / "adapter_config.json").is_file() and not (adapters / "config.json").exists()
    model, tokenizer, _ = load_served_model(str(adapters))
    ids = torch.tensor([tok.encode("q1 say 7")])
    stages.model.eval()
    with torch.no_grad():
        served, trained = model(ids).logits, stages.model(ids).logits
        with stages.model.disable_adapter():
            base = stages.model(ids).logits
    assert torch.allclose(served, trained, atol=1e-5)
    assert (served - base).abs().max() > 1e-4  # the adapters are in the served weights
    srv = build_server(model, tokenizer, port=0, max_tokens_limit=8)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        reply = post(srv, chat("q1 say 7", temperature=0))
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_failed_request_is_shown_on_the_servers_console_once_per_kind(capsys, monkeypatch):
    from lmrl import serve

    monkeypatch.setattr(serve, "_SHOWN", set())
    for _ in range(2):
        try:
            raise MemoryError("the generation ran out of memory")
        except MemoryError as err:
            serve._show_once(err)
    err = capsys.readouterr().err
    assert err.count("a request failed (HTTP 500") == 1 and "MemoryError: the generation ran out of memory" in err
