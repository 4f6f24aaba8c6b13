"""`lmrl serve` machinery on a loopback port with a tiny random model, called through the judge client."""
import json
import threading

import pytest
import requests

from conftest import make_tokenizer
from lmrl.cli import parser
from lmrl.config import RewardComponent, RewardConfig
from lmrl.models import load_model, load_tokenizer, tiny_llama
from lmrl.rewards import RewardScorer
from lmrl.rewards.judge_client import JudgeClient, JudgeHTTPError
from lmrl.serve import build_server, load_served_model
from lmrl.types import Group, Sample


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny")
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(model_dir)
    tiny_llama(vocab_size=len(tokenizer), hidden=32, layers=2, heads=4, seed=0).save_pretrained(model_dir)
    srv = build_server(load_model(model_dir), load_tokenizer(model_dir), port=0, model_name="tiny",
                       max_tokens_limit=64)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv, path=""):
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def ask(text):
    return [{"role": "user", "content": text}]


def test_chat_completion_in_openai_format(server):
    client = JudgeClient(base_url=url(server, "/v1"), model="tiny", max_tokens=12, cache=False)
    reply = client.complete(ask("say 7"), n=2, seed=3)
    assert reply["object"] == "chat.completion" and reply["model"] == "tiny" and reply["id"].startswith("chatcmpl-")
    prompt_ids = server.service.prompt_ids(ask("say 7"))
    usage = reply["usage"]
    assert usage["prompt_tokens"] == len(prompt_ids) and 2 <= usage["completion_tokens"] <= 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    for choice in reply["choices"]:
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
        assert "<|im_end|>" not in choice["message"]["content"]
    greedy = [client.chat(ask("say 7"), temperature=0) for _ in range(2)]
    assert greedy[0] == greedy[1]
    seeded = [client.chat(ask("say 7"), temperature=1.0, seed=11) for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_stop_strings_cut_the_text(server):
    client = JudgeClient(base_url=url(server, "/v1"), max_tokens=20, temperature=0)
    full = client.chat(ask("q"))
    stop = full[3:5]
    assert stop and client.chat(ask("q"), stop=[stop]) == full[: full.find(stop)]


def test_models_health_and_errors(server):
    models = requests.get(url(server, "/v1/models"), timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert requests.get(url(server, "/health"), timeout=5).json()["status"] == "ok"
    assert requests.get(url(server, "/nope"), timeout=5).status_code == 404
    client = JudgeClient(base_url=url(server, "/v1"), retries=3, backoff_s=0.01)
    with pytest.raises(JudgeHTTPError, match="max_tokens") as err:
        client.chat(ask("x"), max_tokens=10_000)
    assert err.value.status == 400 and client.stats["requests"] == 1  # a bad request is not retried
    too_many = requests.post(url(server, "/v1/chat/completions"), json={"messages": ask("x"), "max_tokens": 65},
                             timeout=5).json()["error"]
    assert (too_many["type"], too_many["param"], too_many["code"]) == ("invalid_request_error", "max_tokens", None)
    for body, message in [({"messages": []}, "messages"), ({"messages": ask("x"), "stream": True}, "stream"),
                          ({"messages": [{"role": "user"}]}, "content"), ({"messages": ask("x"), "n": 0}, "'n'")]:
        response = requests.post(url(server, "/v1/chat/completions"), json=body, timeout=5)
        assert response.status_code == 400 and message in response.json()["error"]["message"]
    nulls = {"messages": ask("x"), "max_tokens": 3, "temperature": None, "top_p": None, "n": None, "seed": None}
    assert requests.post(url(server, "/v1/chat/completions"), json=nulls, timeout=30).status_code == 200
    raw = requests.post(url(server, "/v1/chat/completions"), data=b"{oops", timeout=5)
    assert raw.status_code == 400 and json.loads(raw.text)["error"]["type"] == "invalid_request_error"


def test_api_key_is_required_when_set(tmp_path):
    tokenizer = make_tokenizer()
    srv = build_server(tiny_llama(vocab_size=len(tokenizer), hidden=16, layers=1, heads=2), tokenizer, port=0,
                       api_key="k3y")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert requests.get(url(srv, "/v1/models"), timeout=5).status_code == 401
        ok = requests.get(url(srv, "/v1/models"), headers={"Authorization": "Bearer k3y"}, timeout=5)
        assert ok.status_code == 200
    finally:
        srv.shutdown()
        srv.server_close()


def test_cli_serve_arguments():
    args = parser().parse_args(["serve", "default", "--port", "0"])
    assert (args.model, args.host, args.port, args.fn.__name__) == ("default", "127.0.0.1", 0, "cmd_serve")
    assert (args.base, args.max_batch_rows, args.max_queue, args.queue_timeout) == (None, 32, 64, 120.0)
    args = parser().parse_args(["serve", "runs/r/checkpoints/step-000002/model", "--base", "default",
                                "--max-queue", "4", "--queue-timeout", "2.5"])
    assert (args.base, args.max_queue, args.queue_timeout) == ("default", 4, 2.5)


def test_base_is_refused_for_a_full_model(tmp_path):
    model_dir = tmp_path / "full"
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(model_dir)
    tiny_llama(vocab_size=len(tokenizer), hidden=16, layers=1, heads=2).save_pretrained(model_dir)
    with pytest.raises(ValueError, match="--base is for LoRA adapter directories"):
        load_served_model(str(model_dir), base="default")
    model, _, path = load_served_model(str(model_dir))
    assert path == model_dir and model.config.hidden_size == 16


def test_judge_rewards_end_to_end_through_the_server(server):
    """FLIP always yields a number (F1 of whatever the judge wrote); a random model never writes a valid score,
    so the implicit rubric's samples are excluded and counted instead of crashing the run."""
    judge = {"base_url": url(server, "/v1"), "model": "tiny", "max_tokens": 16, "retries": 0}
    samples = [Sample(prompt_ids=[1], completion_ids=[2, 3], behaviour_logprobs=[0.0, 0.0],
                      text=t, row={"question": "say 7", "answer": "7"}) for t in ("7", "it is 7")]
    cfg = RewardConfig(components=[RewardComponent(name="judge_flip", params={"judge": judge}, timeout_s=60)],
                       accuracy_component="judge_flip")
    metrics = RewardScorer(cfg).score([Group(uid="g", row={}, samples=samples)])
    assert metrics["excluded"] == 0.0
    assert all(0.0 <= s.rewards["judge_flip"] <= 1.0 and s.reward == s.rewards["judge_flip"] for s in samples)
    cfg = RewardConfig(components=[RewardComponent(name="judge_rubric_implicit", timeout_s=60,
                                                   params={"judge": {**judge, "max_tokens": 4}, "rubric": "is 7",
                                                           "low": 100, "high": 200})],
                       accuracy_component="judge_rubric_implicit")
    groups = [Group(uid="g", row={}, samples=[Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0],
                                                     text="7", row={"question": "say 7"})])]
    metrics = RewardScorer(cfg).score(groups)
    assert metrics["excluded"] == 1.0 and "no score in [100, 200]" in groups[0].samples[0].excluded
