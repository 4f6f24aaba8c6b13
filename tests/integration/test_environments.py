"""Multi-turn environments in the real loop on a tiny random model: each shipped env trains end to end,
and an environment that fails excludes its episodes while training goes on."""
from __future__ import annotations

import json

import pytest

from conftest import make_tokenizer, toy_run_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama


def run(cfg):
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    return [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_of(rows):
    return [r for r in rows if "reward/mean" in r]


@pytest.mark.parametrize("advantage", ["grpo", "turn_discounted"])
def test_bandit_trains_end_to_end(tmp_path, advantage):
    cfg = toy_run_config(tmp_path, 2, task={"name": "bandit", "params": {"rounds": 3}},
                         env={"name": "bandit", "params": {"rounds": 3, "min_reversal": 1}},
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
                         algo={"advantage": advantage})
    rows = steps_of(run(cfg))
    assert len(rows) == 2
    for r in rows:
        assert r["env/turns"] == 3.0 and r["env/error"] == 0.0 and "env/better_arm" in r and "reward/env" in r
        assert r["response_length/mean"] <= 3 * 4  # policy tokens only: the game's messages are not generated
        assert r["excluded"] == 0.0


def test_tool_use_trains_end_to_end(tmp_path):
    data = tmp_path / "mul.jsonl"
    data.write_text("".join(json.dumps({"question": f"what is {a} times 3?", "answer": str(3 * a)}) + "\n"
                            for a in range(20, 40)))
    cfg = toy_run_config(tmp_path, 2, dataset=data,
                         env={"name": "tool_use", "params": {"tools": ["calculator", "python"]}, "max_turns": 3,
                              "max_episode_tokens": 400},
                         reward={"components": [{"name": "answer"}, {"name": "env"}], "accuracy_component": "answer"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8})
    rows = steps_of(run(cfg))
    assert len(rows) == 2 and all("env/tool_calls" in r and "reward/answer" in r for r in rows)


FLAKY_ENV = '''
from lmrl.envs import Step


class Flaky:
    """Raises on episodes with an odd seed; otherwise two turns, reward 1 each."""

    def reset(self, row, seed):
        return [{"role": "user", "content": "go"}], {"seed": seed, "turn": 0}

    def step(self, reply, state):
        if state["seed"] % 2:
            raise RuntimeError("flaky")
        state["turn"] += 1
        done = state["turn"] == 2
        return Step(None if done else [{"role": "user", "content": "again"}], 1.0, done)
'''


def test_a_failing_environment_excludes_episodes_and_training_goes_on(tmp_path):
    (tmp_path / "flaky_env.py").write_text(FLAKY_ENV)
    cfg = toy_run_config(tmp_path, 3, env={"name": f"{tmp_path / 'flaky_env.py'}:Flaky"},
                         reward={"components": [{"name": "env"}, {"name": "contains_7"}],
                                 "accuracy_component": "contains_7"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4})
    rows = steps_of(run(cfg))
    assert len(rows) == 3
    assert all(0 < r["excluded"] < 1 and r["env/error"] == r["excluded"] for r in rows)
    assert sum(r.get("skipped_updates", 0.0) for r in rows) < 3


def test_guessing_trains_end_to_end(tmp_path):
    cfg = toy_run_config(tmp_path, 2, task={"name": "guessing", "params": {"low": 1, "high": 9, "max_guesses": 3}},
                         env={"name": "guessing", "params": {"low": 1, "high": 9, "max_guesses": 3}},
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4})
    rows = steps_of(run(cfg))
    assert len(rows) == 2
    for r in rows:
        assert 1.0 <= r["env/turns"] <= 3.0 and r["env/error"] == 0.0 and "env/solved" in r and "env/invalid" in r
        assert r["excluded"] == 0.0


def test_reflect_and_revise_trains_end_to_end(tmp_path):
    cfg = toy_run_config(tmp_path, 2, env={"name": "revise", "params": {"max_attempts": 2}},
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4})
    rows = steps_of(run(cfg))
    assert len(rows) == 2
    for r in rows:
        assert 1.0 <= r["env/turns"] <= 2.0 and r["env/error"] == 0.0 and "env/first_try" in r
        assert r["excluded"] == 0.0


def test_held_out_evaluation_plays_episodes_reproducibly(tmp_path):
    cfg = toy_run_config(tmp_path, 1, task={"name": "bandit", "params": {"rounds": 3}, "num_eval": 4},
                         env={"name": "bandit", "params": {"rounds": 3, "min_reversal": 1}},
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
                         eval={"at_start": True, "at_end": True})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    from lmrl.eval.evaluator import evaluate

    first, groups = evaluate(stages.engine, tok, stages.eval_rows, stages.scorer, cfg.eval, 4, "env", seed=0,
                             environment=cfg.env)
    again, _ = evaluate(stages.engine, tok, stages.eval_rows, stages.scorer, cfg.eval, 4, "env", seed=0, environment=cfg.env)
    assert first == again and first["eval/env/turns"] == 3.0 and "eval/env/better_arm" in first
    assert all(g.samples[0].info["turns"] == 3 for g in groups)
    result = train(cfg, stages=stages)
    assert result.eval_before["eval/env/turns"] == 3.0 and "eval/reward" in result.eval_after
