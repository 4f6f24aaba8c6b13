"""The judge client against a scripted OpenAI-compatible server on a loopback port, and the reply parsers."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from conftest import LocalServer
from lmrl.rewards import judge_client as jc
from lmrl.rewards.judge_client import (JudgeClient, JudgeError, JudgeHTTPError, JudgeResponseError, parse_letter_scores,
                                       parse_score, parse_verdict, parse_verdicts, parse_winner)


class FakeEndpoint(LocalServer):
    """Answers /v1/chat/completions by popping scripted actions: 'ok', 'garbage', 'no-choices', an int status,
    or ('sleep', seconds). With the script empty it answers 'ok'. Records requests and peak concurrency."""

    def __init__(self, delay_s: float = 0.0):
        self.script, self.bodies, self.headers = [], [], []
        self.delay_s, self.in_flight, self.peak = delay_s, 0, 0
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    endpoint.bodies.append(body)
                    endpoint.headers.append(dict(self.headers))
                    action = endpoint.script.pop(0) if endpoint.script else "ok"
                    endpoint.in_flight += 1
                    endpoint.peak = max(endpoint.peak, endpoint.in_flight)
                try:
                    time.sleep(endpoint.delay_s)
                    if isinstance(action, tuple):
                        time.sleep(action[1])
                        action = "ok"
                    status, payload = 200, b"{not json"
                    if isinstance(action, int):
                        status, payload = action, b'{"error": {"message": "scripted"}}'
                    elif action == "no-choices":
                        payload = b'{"choices": []}'
                    elif action == "ok":
                        text = "echo " + body["messages"][-1]["content"]
                        payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                           "finish_reason": "stop"}]}).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass
                finally:
                    with endpoint.lock:
                        endpoint.in_flight -= 1

        super().__init__(Handler)


@pytest.fixture
def endpoint():
    e = FakeEndpoint()
    yield e
    e.close()


def client(endpoint, **kw):
    kw = {"retries": 3, "backoff_s": 0.01, "backoff_max_s": 0.02, "timeout_s": 5.0, **kw}
    return JudgeClient(base_url=endpoint.url, model="judge", **kw)


def ask(text="hello"):
    return [{"role": "user", "content": text}]


def test_request_body_and_reply(endpoint, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sekret")
    c = client(endpoint, api_key_env="JUDGE_KEY", temperature=0.3, max_tokens=17, extra_params={"top_p": 0.9})
    assert c.chat(ask("hi")) == "echo hi"
    body = endpoint.bodies[0]
    assert body == {"model": "judge", "messages": ask("hi"), "temperature": 0.3, "max_tokens": 17, "top_p": 0.9}
    assert endpoint.headers[0]["Authorization"] == "Bearer sekret"


def test_retries_on_500_with_exponential_backoff(endpoint, monkeypatch):
    waits, caller, real_sleep = [], threading.current_thread(), time.sleep
    monkeypatch.setattr(jc.time, "sleep", lambda s: waits.append(s) if threading.current_thread() is caller
                        else real_sleep(s))
    endpoint.script = [500, 503, 502]
    c = client(endpoint, backoff_s=0.5, backoff_max_s=1.5, jitter=0.0)
    assert c.chat(ask()) == "echo hello"
    assert len(endpoint.bodies) == 4
    assert waits == [0.5, 1.0, 1.5]  # doubling, capped at backoff_max_s
    assert c.stats == {"requests": 4, "cache_hits": 0, "retries": 3, "failures": 0}


def test_backoff_jitter_stays_in_its_band():
    c = JudgeClient(backoff_s=1.0, backoff_max_s=100.0, jitter=0.25)
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0)]:
        waits = [c._backoff(attempt) for _ in range(50)]
        assert all(0.75 * base <= w <= 1.25 * base for w in waits)
        assert len(set(waits)) > 1


def test_gives_up_after_retries_with_a_clear_error(endpoint):
    endpoint.script = [500] * 3
    with pytest.raises(JudgeError, match=r"failed after 3 attempt\(s\): HTTP 500"):
        client(endpoint, retries=2).chat(ask())
    assert len(endpoint.bodies) == 3


def test_client_errors_are_not_retried(endpoint):
    endpoint.script = [400]
    with pytest.raises(JudgeHTTPError) as err:
        client(endpoint).chat(ask())
    assert err.value.status == 400 and len(endpoint.bodies) == 1


def test_timeout_is_retried(endpoint):
    endpoint.script = [("sleep", 1.0)]
    c = client(endpoint, timeout_s=0.2)
    assert c.chat(ask()) == "echo hello"
    assert len(endpoint.bodies) == 2 and c.stats["retries"] == 1
    endpoint.script = [("sleep", 1.0)]
    with pytest.raises(JudgeError, match="timed out after 0.2s"):
        client(endpoint, timeout_s=0.2, retries=0).chat(ask("other"))


@pytest.mark.parametrize("bad", ["garbage", "no-choices"])
def test_unparseable_reply_is_retried(endpoint, bad):
    endpoint.script = [bad]
    assert client(endpoint).chat(ask()) == "echo hello"
    assert len(endpoint.bodies) == 2
    endpoint.script = [bad, bad]
    with pytest.raises(JudgeError, match="not a chat completion"):
        client(endpoint, retries=1).chat(ask("x"))


def test_connection_refused_is_a_judge_error():
    with pytest.raises(JudgeError, match="connection failed"):
        JudgeClient(base_url="http://127.0.0.1:9/v1", retries=1, backoff_s=0.01).chat(ask())


def test_cache_hits_and_keys(endpoint, tmp_path):
    path = tmp_path / "judge_cache.json"
    c = client(endpoint, cache_path=str(path))
    assert c.chat(ask("a")) == c.chat(ask("a")) == "echo a"
    assert len(endpoint.bodies) == 1 and c.stats["cache_hits"] == 1
    c.chat(ask("a"), temperature=0.7)  # other sampling params: another key
    c.chat(ask("b"))
    assert len(endpoint.bodies) == 3
    reloaded = client(endpoint, cache_path=str(path))
    assert reloaded.chat(ask("b")) == "echo b" and len(endpoint.bodies) == 3
    with open(path, "a") as f:
        f.write('{"key": "cut short by a cra')  # a torn last line is skipped on load
    assert client(endpoint, cache_path=str(path)).chat(ask("a")) == "echo a" and len(endpoint.bodies) == 3
    small = client(endpoint, cache_max_entries=2)
    for text in ("p", "q", "p", "r", "p", "q"):  # q is least recently used when r arrives
        small.chat(ask(text))
    assert [b["messages"][0]["content"] for b in endpoint.bodies[3:]] == ["p", "q", "r", "q"]
    uncached = client(endpoint, cache=False)
    uncached.chat(ask("a"))
    uncached.chat(ask("a"))
    assert len(endpoint.bodies) == 9


def test_concurrency_limit_is_respected():
    slow = FakeEndpoint(delay_s=0.15)
    try:
        c = client(slow, max_concurrency=2)
        answers = c.chat_many([ask(str(i)) for i in range(6)], per_call=[{"seed": i} for i in range(6)])
        assert answers == [f"echo {i}" for i in range(6)]
        assert [b["seed"] for b in sorted(slow.bodies, key=lambda b: b["seed"])] == list(range(6))
        assert slow.peak == 2
    finally:
        slow.close()


def test_unknown_client_option_is_named():
    with pytest.raises(ValueError, match=r"unknown judge client option\(s\) \['base'\]; valid: .*base_url"):
        JudgeClient.from_params({"base": "x"})
    with pytest.raises(ValueError, match="max_concurrency"):
        JudgeClient(max_concurrency=0)


@pytest.mark.parametrize("reply,verdict", [
    ("Verdict: yes", 1), ("The response misses it.\nVerdict: **no**", 0), ("<think>yes yes</think>No.", 0),
    ("It is met, not just partially.\nVerdict: not met", 0), ("YES", 1), ("criterion satisfied", 1),
])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_parse_verdicts_lines_and_json():
    assert parse_verdicts("1: yes\n2. no\n3) **yes** because", 3) == [1, 0, 1]
    assert parse_verdicts('```json\n{"1": "yes", "2": false}\n```', 2) == [1, 0]
    assert parse_verdicts("[true, false, true]", 3) == [1, 0, 1]
    with pytest.raises(JudgeResponseError, match=r"criteria \[2\]"):
        parse_verdicts("1: yes", 2)


def test_parse_scores_and_winners():
    assert parse_score("I'd say 11 is too high. Score: 7/10", 1, 10) == 7
    assert parse_score("rating = 3.5", 1, 5) == 3.5
    with pytest.raises(JudgeResponseError):
        parse_score("Score: 42", 1, 10)
    assert parse_letter_scores("A is best.\nA: 8, B: 3\nthanks", "AB") == {"A": 8.0, "B": 3.0}
    with pytest.raises(JudgeResponseError):
        parse_letter_scores("A: 8", "AB")
    assert parse_winner("Both fine. Winner: B") == "B"
    assert parse_winner("[[A]]") == "A"
    assert parse_winner("analysis...\nA") == "A"
    with pytest.raises(JudgeResponseError):
        parse_winner("A and B are equal\nA or B")
