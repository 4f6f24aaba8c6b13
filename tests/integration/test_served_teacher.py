"""On-policy distillation from a teacher served by `lmrl serve` (`teacher_kl`'s `params.endpoint`): the same
`teacher_kl` metrics as the same weights loaded in the run; a teacher that is down, answers garbage or has
another vocabulary fails the step with the endpoint named; what cannot work is refused before any model loads."""
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import CHARS, make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.loops import build_stages, train
from lmrl.models import load_model, load_tokenizer, tiny_llama
from lmrl.rewards.judge_client import JudgeError
from lmrl.serve import build_server


def constant(sample, **_):
    """A reward every sample gets: GRPO advantages are 0, so only the distillation term trains."""
    return 1.0


def teacher_dir(path, tokenizer):
    tiny_llama(len(tokenizer), hidden=32, layers=2, heads=4, seed=7).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def serve(model, tokenizer):
    srv = build_server(model, tokenizer, port=0, model_name="teacher")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def base_url(srv):
    return f"http://127.0.0.1:{srv.server_address[1]}/v1"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """The teacher's directory and a server of the same weights; a server of a teacher with another vocabulary."""
    root = tmp_path_factory.mktemp("teacher")
    path = teacher_dir(root / "teacher", make_tokenizer())
    other_tok = make_tokenizer(list(reversed(CHARS)))
    other = teacher_dir(root / "other", other_tok)
    servers = [serve(load_model(path), load_tokenizer(path)), serve(load_model(other), load_tokenizer(other))]
    yield path, servers
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def distil(tmp_path, name, steps=2, **params):
    from lmrl.rewards import REWARD_FNS

    if "constant_one" not in REWARD_FNS:
        REWARD_FNS.register("constant_one", "the same reward for every sample (tests)")(constant)
    return toy_run_config(tmp_path / name, steps, reward={"components": [{"name": "constant_one"}],
                                                         "accuracy_component": "constant_one"},
                          algo={"terms": [{"name": "teacher_kl", "params": params}]})


def run(cfg):
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["teacher_kl"] for r in rows if "teacher_kl" in r]


def test_a_served_teacher_gives_the_in_process_teachers_metrics(tmp_path, teacher):
    path, (srv, _) = teacher
    loaded = run(distil(tmp_path, "loaded", model=str(path)))
    served = run(distil(tmp_path, "served", endpoint={"base_url": base_url(srv), "model": "teacher",
                                                      "rows_per_request": 5}))
    assert len(loaded) == 2 and loaded[0] != loaded[1] and abs(loaded[0]) > 1e-3
    assert served == pytest.approx(loaded, abs=1e-6)
    assert srv.service.queue.stats["requests"] >= 2 * 7  # 32 rows a step, 5 a request


class Garbage(BaseHTTPRequestHandler):
    """Answers every POST 200 with a text completion that holds no log-probs."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        payload = json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": "hello"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_):
        pass


def test_a_teacher_that_is_down_or_answers_garbage_fails_the_step(tmp_path, teacher):
    down = {"base_url": "http://127.0.0.1:9/v1", "retries": 1, "backoff_s": 0.01}
    with pytest.raises(JudgeError, match=r"teacher_kl term's teacher http://127.0.0.1:9/v1/completions .*2 "
                                         r"attempt\(s\): connection failed"):
        run(distil(tmp_path, "down", steps=1, endpoint=down))
    stub = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    try:
        with pytest.raises(JudgeError, match="not a text completion with logprobs"):
            run(distil(tmp_path, "garbage", steps=1, endpoint={"base_url": base_url(stub), "retries": 0}))
    finally:
        stub.shutdown()
        stub.server_close()


def test_a_teacher_with_another_vocabulary_is_refused_on_its_first_reply(tmp_path, teacher):
    other = teacher[1][1]
    with pytest.raises(ValueError, match="gives token id .* the text .*needs the same vocabulary"):
        run(distil(tmp_path, "other", steps=1, endpoint={"base_url": base_url(other)}))


@pytest.mark.parametrize("term, params, words", [
    ("teacher_kl", {"endpoint": {"base_url": "http://x/v1"}, "model": "default"}, "not both"),
    ("teacher_kl", {"endpoint": {"base_url": "x:8000"}}, "http(s) URL"),
    ("teacher_kl", {"endpoint": {"base_url": "http://x/v1", "timeout": 3}}, "unknown key(s) ['timeout']"),
    ("teacher_kl", {"endpoint": {"base_url": "http://x/v1", "rows_per_request": 0}}, "integer >= 1"),
    ("gkd", {"endpoint": {"base_url": "http://x/v1"}}, "whole distribution"),
])
def test_what_a_served_teacher_cannot_do_is_refused_before_any_model_loads(tmp_path, term, params, words):
    with pytest.raises(ConfigError, match=re.escape(f"algo.terms[0] ({term}): ") + ".*" + re.escape(words)):
        toy_run_config(tmp_path, 1, algo={"terms": [{"name": term, "params": params}]})


def test_a_served_teacher_needs_sampling_at_temperature_one(tmp_path):
    with pytest.raises(ConfigError, match="rollout.temperature=0.7"):
        toy_run_config(tmp_path, 1, rollout={"temperature": 0.7},
                       algo={"terms": [{"name": "teacher_kl", "params": {"endpoint": {"base_url": "http://x/v1"}}}]})
