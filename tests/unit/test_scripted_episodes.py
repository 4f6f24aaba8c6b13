"""Worked episodes of an environment (`task.demonstration` as a script): played against the real environment,
token ids assembled as a rollout's are, episodes that leave their script counted by reason."""
from __future__ import annotations

import pytest

from conftest import CHARS, make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.data.scripted_episodes import ENDED_EARLY, NOT_ENDED, episode_demonstrations
from lmrl.data.sources import task_demonstrations
from lmrl.envs.chat import encode_opening, observation_ids
from lmrl.envs.code_interpreter import SYSTEM_PROMPT
from lmrl.types import Origin

TOK = make_tokenizer(CHARS + list("()*`_,!ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
CODE = "```python\nprint({x} * {y})\n```"
ROWS = [{"uid": f"u{i}", "question": f"what is {x} * {y}?", "answer": str(x * y), "x": x, "y": y}
        for i, (x, y) in enumerate([(3, 4), (12, 5)])]


ENV_REWARD = {"components": [{"name": "contains_7"}, {"name": "env"}], "accuracy_component": "contains_7"}


def config(tmp_path, script, **env):
    return toy_run_config(tmp_path, 1, task={"demonstration": script, "system_prompt": None},
                          env={"name": "code_interpreter", "max_turns": 4, **env}, reward=ENV_REWARD,
                          batches={"source": "demonstrations", "num_eval": 1}, algo={"preset": "sft"})


def test_a_worked_episode_is_the_rollout_a_policy_writing_it_would_make(tmp_path):
    cfg = config(tmp_path, [CODE, "Answer: {answer}"])
    kept, dropped = episode_demonstrations(cfg, TOK, ROWS, "row-")
    assert not dropped and [g.uid for g in kept] == ["row-0", "row-1"]
    x = kept[1].samples[0]
    opening = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "what is 12 * 5?"}]
    assert x.prompt_ids == encode_opening(TOK, opening)  # the environment's own opening, system prompt included
    eos = TOK.eos_token_id
    turn1 = TOK("```python\nprint(12 * 5)\n```", add_special_tokens=False)["input_ids"] + [eos]
    shown = observation_ids(TOK, [{"role": "user", "content": "Output:\n60\n"}], eos)  # the sandbox really ran it
    turn2 = TOK("Answer: 60", add_special_tokens=False)["input_ids"] + [eos]
    assert x.completion_ids == turn1 + shown + turn2
    assert x.loss_mask == [1] * len(turn1) + [0] * len(shown) + [1] * len(turn2)
    assert x.origin == Origin.DATASET and x.info["turns"] == 2 and x.excluded is None
    assert x.info["metrics"]["env/code_runs"] == 1.0 and x.info["metrics"]["env/code_errors"] == 0.0


def test_episodes_that_leave_their_script_are_counted_by_reason(tmp_path):
    kept, dropped = episode_demonstrations(config(tmp_path, [CODE]), TOK, ROWS, "row-")
    assert not kept and dropped == {NOT_ENDED: 2}  # the environment waits for an answer after the code
    kept, dropped = episode_demonstrations(config(tmp_path, ["Answer: {answer}", CODE]), TOK, ROWS, "row-")
    assert not kept and dropped == {ENDED_EARLY: 2}  # an answer ends the episode at turn 1 of 2
    kept, dropped = episode_demonstrations(config(tmp_path, [CODE, "Answer: {answer}"], max_episode_tokens=30),
                                           TOK, ROWS, "row-")
    assert not kept and sum(dropped.values()) == 2 and list(dropped) == ["past env.max_episode_tokens"]


def test_the_batch_source_plays_train_and_held_out_rows_and_says_why_none_is_left(tmp_path):
    data = task_demonstrations(config(tmp_path, [CODE, "Answer: {answer}"]), TOK, ROWS[:1], ROWS[1:])
    assert [len(data.train), len(data.eval)] == [1, 1] and "worked episodes of environment code_interpreter" in data.source
    with pytest.raises(ValueError, match="no worked episode .* followed its script .*2 still going"):
        task_demonstrations(config(tmp_path, [CODE]), TOK, ROWS, [])


def test_a_script_needs_an_environment_and_the_demonstrations_source(tmp_path):
    with pytest.raises(ConfigError, match="worked episode of an environment: it needs env.name"):
        toy_run_config(tmp_path, 1, task={"demonstration": [CODE, "Answer: {answer}"]},
                       batches={"source": "demonstrations"}, algo={"preset": "sft"})
    with pytest.raises(ConfigError, match="not data.demonstrations=rescue"):
        toy_run_config(tmp_path, 1, task={"demonstration": [CODE]}, env={"name": "code_interpreter"},
                       reward=ENV_REWARD, data={"demonstrations": "rescue"})
    with pytest.raises(ConfigError, match="empty list"):
        config(tmp_path, [])
    with pytest.raises(ConfigError, match="leave batches.on_policy unset"):
        toy_run_config(tmp_path, 1, task={"demonstration": [CODE]}, env={"name": "code_interpreter"},
                       reward=ENV_REWARD, batches={"source": "demonstrations", "on_policy": 0.5}, algo={"preset": "sft"})


def test_sft_on_worked_episodes_trains_the_policy_turns_only(tmp_path):
    import json

    from lmrl.loops import build_stages, train
    from lmrl.models import tiny_llama

    cfg = toy_run_config(tmp_path, 10, num_train=8, num_eval=2, trainer={"lr": 3e-3},
                         task={"demonstration": ["```python\nprint({answer})\n```", "answer: {answer}"],
                               "system_prompt": None},
                         env={"name": "code_interpreter", "max_turns": 2}, reward=ENV_REWARD,
                         batches={"source": "demonstrations", "size": 4, "num_eval": 2}, algo={"preset": "sft"})
    stages = build_stages(cfg, model=tiny_llama(len(TOK), hidden=32, layers=2, heads=4, seed=0), tokenizer=TOK)
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "nll" in r]
    x = stages.offline.train[0].samples[0]
    trained = TOK.decode([t for t, m in zip(x.completion_ids, x.loss_mask) if m])
    assert trained == "```python\nprint(7)\n```<|im_end|>answer: 7<|im_end|>"  # the sandbox's output is not trained
    assert steps[0]["data/trained_tokens"] == 4 * sum(x.loss_mask)
    nll = [r["nll"] for r in steps]
    assert all(b < a for a, b in zip(nll, nll[1:])) and nll[-1] < 0.8 * nll[0]
