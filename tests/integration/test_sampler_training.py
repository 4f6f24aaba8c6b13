"""The adaptive samplers in the real loop on a tiny model: the loop feeds them every scored batch, their
state is checkpointed, and a resumed run draws the prompts the uninterrupted one drew."""
from __future__ import annotations

import json

import pytest

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama

SAMPLERS = {
    "hive": {"entropy_threshold": 0.5, "probe_tokens": 3},
    "heapa": {"mode": "mixed"},
    "curriculum": {"difficulty_field": "level", "start": 0.0, "ramp_steps": 2, "window": [0.0, 0.9]},
    "rail": {"shadow_steps": 1},
}


def toy_task(path, n: int = 48):
    """'say 7' prompts with a difficulty `level` 0–2."""
    path.write_text("".join(json.dumps({"question": f"q{i % 10} say 7", "answer": "7", "level": i % 3}) + "\n"
                            for i in range(n)))
    return path


def run(tmp_path, name: str, steps: int, resume=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = toy_run_config(tmp_path, steps, dataset=toy_task(tmp_path / "toy.jsonl"), num_eval=4, num_train=44,
                         data={"sampler": name, "sampler_params": SAMPLERS[name]},
                         run={"checkpoint_every": 1})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    drawn: list[list[str]] = []
    original = stages.sampler.next_prompts

    def recording(n):
        rows = original(n)
        drawn.append([r["uid"] for r in rows])
        return rows

    stages.sampler.next_prompts = recording
    train(cfg, resume=resume, stages=stages)
    return stages.sampler, drawn


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sampler_learns_in_the_loop_and_resumes_to_the_same_prompts(tmp_path, name):
    full, drawn = run(tmp_path / "a", name, steps=3)
    assert len(drawn) == 3
    observed = {u for batch in drawn for u in batch}
    assert set(full.stats.records) == observed  # the loop called observe on every scored batch
    assert full.stats.clock == 2  # the rollouts of step 3 came from the policy after 2 updates
    if name == "hive":
        assert full.probe is not None  # bound by the run: stage 2 probed with the model
    if name == "curriculum":
        assert all(int(u) % 3 == 0 for u in drawn[0])  # step 1: the easiest level only

    logged = [json.loads(line) for line in (tmp_path / "a" / "runs" / "toy" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if "sampler/seen_share" in r]
    assert len(steps) == 3 and steps[-1]["sampler/seen_share"] == len(observed) / 44  # the sampler's own metrics
    if name == "curriculum":
        assert [r["sampler/frontier"] for r in steps] == [0.0, 0.0, 0.5]  # the clock of each draw, ramp 2
    if name == "heapa":
        assert steps[-1]["sampler/cold"] + steps[-1]["sampler/low"] + steps[-1]["sampler/high"] <= 44
    if name == "rail":
        assert sum(steps[-1][f"sampler/arm_{a}"] for a in ("none", "retry", "revisit")) == pytest.approx(1.0)

    half, first = run(tmp_path / "b", name, steps=2)
    assert first == drawn[:2]
    resumed, rest = run(tmp_path / "b", name, steps=3, resume=tmp_path / "b" / "runs" / "toy")
    assert rest == drawn[2:]  # the checkpointed state draws step 3's prompts again
    assert set(resumed.stats.records) == observed


def test_a_probing_sampler_is_refused_by_the_asynchronous_loop_when_the_config_is_read(tmp_path):
    with pytest.raises(ConfigError, match="without rollout.max_staleness"):
        toy_run_config(tmp_path, 2, dataset=toy_task(tmp_path / "toy.jsonl"), data={"sampler": "hive"},
                       rollout={"max_staleness": 1})
