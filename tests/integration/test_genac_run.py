"""GenAC in a real loop on the tiny model: a critic endpoint answers `Value: 0.5`, the `genac` advantage reads it,
and a resumed run shows the critic the same recent rollouts as the uninterrupted one (the memory is checkpointed)."""
import json
from http.server import BaseHTTPRequestHandler

import pytest

from conftest import LocalServer, run_tiny, toy_run_config


class CriticEndpoint(LocalServer):
    """An OpenAI-compatible chat endpoint that answers every prompt with `Value: 0.5` and records the prompts."""

    def __init__(self):
        self.prompts: list[str] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.prompts.append(body["messages"][-1]["content"])
                payload = json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": "They often succeed.\nValue: 0.5"}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        super().__init__(Handler)


@pytest.fixture
def critic():
    endpoint = CriticEndpoint()
    yield endpoint
    endpoint.close()


def genac_config(tmp_path, steps, url):
    return toy_run_config(
        tmp_path, steps,
        reward={"components": [{"name": "contains_7"},
                               {"name": "genac_value", "weight": 0.0,
                                "params": {"critic": {"base_url": url, "cache": False, "retries": 0}, "k": 2,
                                           "accuracy": "contains_7"}}]},
        algo={"advantage": "genac"},
        rollout={"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        run={"output_dir": str(tmp_path / "runs"), "name": "toy", "progress": False, "checkpoint_every": 2})


def steps_of(rows):
    return [r for r in rows if "reward/mean" in r]


def test_genac_trains_and_a_resumed_critic_sees_the_same_context(tmp_path, critic):
    from lmrl.loading import load_run_config

    straight = steps_of(run_tiny(genac_config(tmp_path / "a", 4, critic.url))[0])
    straight_prompts, critic.prompts = critic.prompts, []
    assert len(straight) == 4 and len(straight_prompts) == 16  # one critic call per group
    assert all(r["reward/genac_value"] == 0.5 and r["reward/mean"] == pytest.approx(r["reward/contains_7"])
               for r in straight)  # weight 0: the value is logged, not added to the reward
    assert any("Attempt 1 (" in p for p in straight_prompts[4:])  # later groups see earlier rollouts
    assert "(none yet)" in straight_prompts[0]

    run_tiny(genac_config(tmp_path / "b", 2, critic.url))
    assert critic.prompts == straight_prompts[:8]
    critic.prompts = []
    run_dir = tmp_path / "b" / "runs" / "toy"
    resumed = steps_of(run_tiny(load_run_config(run_dir, ["trainer.steps=4"]), resume=run_dir)[0])
    assert critic.prompts == straight_prompts[8:]
    keys = ("reward/mean", "loss")
    assert [r[k] for r in resumed if r["step"] > 2 for k in keys] == \
        pytest.approx([r[k] for r in straight if r["step"] > 2 for k in keys], rel=1e-5)
