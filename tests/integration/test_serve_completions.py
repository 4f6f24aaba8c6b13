"""`lmrl serve`'s legacy `/v1/completions` route on a tiny random model: echoed token-id prompts come back with
each token's log-prob given its prefix, equal to a direct forward pass; token-id prompts generate as the chat
route does; concurrent scoring requests share one forward pass; what is not served is a 400 naming the field."""
import threading

import pytest
import requests
import torch

from conftest import make_tokenizer
from lmrl.models import tiny_llama
from lmrl.serve import build_server

PROMPTS = [[1, 5, 9, 12, 7, 3, 30], [2, 8, 8, 4]]


@pytest.fixture(scope="module")
def served():
    tok = make_tokenizer()
    model = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=3)
    srv = build_server(model, tok, port=0, model_name="tiny", max_tokens_limit=16, max_batch_rows=4,
                       context_length=64)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, model, tok
    srv.shutdown()
    srv.server_close()


def post(srv, body, route="/v1/completions"):
    return requests.post(f"http://127.0.0.1:{srv.server_address[1]}{route}", json=body, timeout=30)


def direct_logprobs(model, ids):
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
    return logp, logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def test_echoed_prompts_carry_each_tokens_logprob_of_one_forward_pass(served):
    srv, model, tok = served
    reply = post(srv, {"model": "tiny", "prompt": PROMPTS, "echo": True, "max_tokens": 0, "logprobs": 1}).json()
    assert reply["object"] == "text_completion" and reply["id"].startswith("cmpl-") and reply["model"] == "tiny"
    assert reply["usage"] == {"prompt_tokens": 11, "completion_tokens": 0, "total_tokens": 11}
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    for ids, choice in zip(PROMPTS, reply["choices"]):
        lp = choice["logprobs"]
        logp, own = direct_logprobs(model, ids)
        assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(ids)
        assert torch.allclose(torch.tensor(lp["token_logprobs"][1:]), own, atol=1e-5)
        assert lp["tokens"] == [tok.decode([t]) for t in ids] and choice["text"] == tok.decode(ids)
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(ids))]
        assert choice["finish_reason"] == "length" and lp["top_logprobs"][0] is None
        for t, top in enumerate(lp["top_logprobs"][1:]):  # the argmax and the token itself
            best = int(logp[t].argmax())
            assert top[tok.decode([best])] == pytest.approx(float(logp[t, best]), abs=1e-5)
            assert top[tok.decode([ids[t + 1]])] == pytest.approx(float(own[t]), abs=1e-5)
            assert set(top) == {tok.decode([best]), tok.decode([ids[t + 1]])}
    single = post(srv, {"prompt": PROMPTS[1], "echo": True, "max_tokens": 0, "logprobs": 0}).json()["choices"]
    alone, batched = single[0]["logprobs"]["token_logprobs"], reply["choices"][1]["logprobs"]["token_logprobs"]
    assert len(single) == 1 and alone[0] is None and alone[1:] == pytest.approx(batched[1:], abs=1e-5)
    assert [list(d) for d in single[0]["logprobs"]["top_logprobs"][1:]] == [[tok.decode([t])] for t in PROMPTS[1][1:]]
    text_only = post(srv, {"prompt": PROMPTS[1], "echo": True, "max_tokens": 0}).json()["choices"][0]
    assert text_only["logprobs"] is None and text_only["text"] == tok.decode(PROMPTS[1])


def test_token_id_prompts_generate_as_the_chat_route_does(served):
    srv, _, tok = served
    messages = [{"role": "user", "content": "say 7"}]
    ids = srv.service.prompt_ids(messages)
    chat = post(srv, {"messages": messages, "max_tokens": 6, "temperature": 0}, "/v1/chat/completions").json()
    plain = post(srv, {"prompt": ids, "max_tokens": 6, "temperature": 0}).json()
    assert plain["choices"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert plain["usage"] == chat["usage"]
    two = post(srv, {"prompt": [ids, ids[:-2]], "max_tokens": 3, "n": 2, "temperature": 0}).json()["choices"]
    assert [c["index"] for c in two] == [0, 1, 2, 3] and two[0]["text"] == two[1]["text"]


def test_concurrent_scoring_requests_share_one_forward_pass(served):
    srv = served[0]
    engine, calls = srv.service.engine, []
    entered, released = threading.Event(), threading.Event()
    score = engine.score

    def gated(prompts, top=0):
        calls.append(len(prompts))
        if len(calls) == 1:
            entered.set()
            assert released.wait(30)
        return score(prompts, top)

    engine.score = gated
    try:
        body = {"prompt": PROMPTS[0], "echo": True, "max_tokens": 0, "logprobs": 1}
        replies = [None] * 4
        threads = [threading.Thread(target=lambda i=i: replies.__setitem__(i, post(srv, body).json()))
                   for i in range(4)]
        threads[0].start()
        assert entered.wait(30)
        for t in threads[1:]:
            t.start()
        while srv.service.queue.waiting < 3:
            threading.Event().wait(0.01)
        released.set()
        for t in threads:
            t.join(30)
    finally:
        engine.score = score
    assert calls == [1, 3]
    assert all(r["choices"][0]["logprobs"] == replies[0]["choices"][0]["logprobs"] for r in replies)


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "say 7", "echo": True, "max_tokens": 0}, "prompt", "list of token ids"),
    ({"prompt": [[1, 2], []], "echo": True, "max_tokens": 0}, "prompt", "list of token ids"),
    ({"prompt": [1, 10_000], "echo": True, "max_tokens": 0}, "prompt", "outside the model's vocabulary"),
    ({"prompt": [[1, 2]] * 5, "echo": True, "max_tokens": 0}, "prompt", "max_batch_rows"),
    ({"prompt": [1] * 65, "echo": True, "max_tokens": 0}, "prompt", "maximum context length is 64"),
    ({"prompt": [1, 2], "echo": True, "max_tokens": 4}, "max_tokens", "must be 0"),
    ({"prompt": [1, 2], "echo": True, "max_tokens": 0, "n": 2}, "n", "'n' must be 1"),
    ({"prompt": [1, 2], "echo": True, "max_tokens": 0, "logprobs": 6}, "logprobs", "[0, 5]"),
    ({"prompt": [1, 2], "echo": "yes", "max_tokens": 0}, "echo", "true or false"),
    ({"prompt": [1, 2], "max_tokens": 4, "logprobs": 1}, "logprobs", "echoed prompts only"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens", "[1, 16]"),
    ({"prompt": [1, 2], "max_tokens": 4, "stream": True}, "stream", "stream"),
    ({"prompt": [1, 2], "max_tokens": 4, "suffix": "x"}, "suffix", "suffix"),
    ({"prompt": [1, 2], "max_tokens": 4, "best_of": 3}, "best_of", "best_of"),
    ({"prompt": [[1, 2], [3]], "max_tokens": 4, "seed": 1}, "seed", "one prompt"),
])
def test_what_is_not_served_is_a_400_naming_the_field(served, body, param, words):
    response = post(served[0], body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"]
