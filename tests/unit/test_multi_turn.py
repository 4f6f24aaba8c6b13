"""The episode runner: token-in-token-out across turns, batching of turn rounds, limits, env failures."""
from __future__ import annotations

import time

import pytest
import torch

from conftest import make_tokenizer
from lmrl.engines import ENGINES, Completion, SamplingParams
from lmrl.envs import Step, build_env, delayed_attribution
from lmrl.envs.chat import TemplateError, encode_opening, observation_text
from lmrl.envs.episodes import Limits, run_episodes
from lmrl.models import tiny_llama
from lmrl.types import Sample, collate


class Scripted:
    """An environment that ends row `r` after `row["turns"]` replies, rewarding turn j with j + 1."""

    def reset(self, row, seed):
        return [{"role": "user", "content": row["question"]}], {"turn": 0, "turns": row["turns"]}

    def step(self, reply, state):
        state["turn"] += 1
        done = state["turn"] >= state["turns"]
        obs = None if done else [{"role": "user", "content": f"more {state['turn']}"}]
        return Step(obs, float(state["turn"]), done)


class FixedEngine:
    """Answers every prompt with the same ids ending in EOS; records each call's prompts."""

    def __init__(self, ids, eos):
        self.ids, self.eos, self.calls, self.pad_token_id = ids, eos, [], 0

    def generate(self, prompts, n, params, generator=None):
        self.calls.append([list(p) for p in prompts])
        return [[Completion(self.ids + [self.eos], [-0.5] * (len(self.ids) + 1), "stop", [0] * (len(self.ids) + 1))]
                for _ in prompts]


class RecordingEngine:
    """The real hf engine, recording what it sampled for each prompt (and the size of each call)."""

    def __init__(self, engine):
        self.engine, self.sampled, self.calls = engine, {}, []
        self.pad_token_id = engine.pad_token_id

    def generate(self, prompts, n, params, generator=None):
        out = self.engine.generate(prompts, n, params, generator)
        self.calls.append(len(prompts))
        for p, outs in zip(prompts, out):
            self.sampled.setdefault(tuple(p), []).append(outs[0])
        return out


def rows(*turns):
    return [{"uid": f"r{i}", "question": "go", "answer": "", "turns": t} for i, t in enumerate(turns)]


@pytest.fixture
def tok():
    return make_tokenizer()


def test_observation_is_the_templates_continuation(tok):
    eos = tok.eos_token_id
    obs = [{"role": "user", "content": "hi"}]
    assert observation_text(tok, obs, eos) == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert observation_text(tok, obs, None).startswith("<|im_end|>\n<|im_start|>user")  # a cut turn is closed
    reply = tok("ok", add_special_tokens=False)["input_ids"] + [eos]
    opening = [{"role": "user", "content": "go"}]
    env_ids = tok(observation_text(tok, obs, eos), add_special_tokens=False)["input_ids"]
    ids = encode_opening(tok, opening) + reply + env_ids
    whole = opening + [{"role": "assistant", "content": "ok"}] + obs
    assert ids == tok.apply_chat_template(whole, add_generation_prompt=True, tokenize=True)["input_ids"]


def test_a_template_that_rewrites_earlier_turns_is_refused(tok):
    tok.chat_template = "{{ messages[-1]['content'] }}"
    with pytest.raises(TemplateError, match="continuation"):
        observation_text(tok, [{"role": "user", "content": "hi"}], tok.eos_token_id)


def test_one_engine_call_per_turn_round_with_every_live_episode(tok):
    engine = FixedEngine(tok("ab", add_special_tokens=False)["input_ids"], tok.eos_token_id)
    groups = run_episodes(engine, tok, rows(1, 2, 3), 2, SamplingParams(), Scripted(), Limits())
    assert [len(c) for c in engine.calls] == [6, 4, 2]
    for g, turns in zip(groups, (1, 2, 3)):
        for x in g.samples:
            assert x.info["turn_rewards"] == [float(j + 1) for j in range(turns)]
            assert x.num_generated == 3 * turns and x.finish_reason == "stop" and x.excluded is None
            assert x.text == "ab"


def test_token_in_token_out_across_turns(tok):
    model = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)
    engine = RecordingEngine(ENGINES.get("hf")(model, [tok.eos_token_id], tok.pad_token_id))
    groups = run_episodes(engine, tok, rows(3, 3), 2, SamplingParams(max_new_tokens=5), Scripted(),
                          Limits(max_episode_tokens=500), torch.Generator().manual_seed(0))
    samples = [x for g in groups for x in g.samples]
    assert engine.calls == [4, 4, 4]
    for x in samples:
        sampled_ids, start = [], 0
        while start < len(x.completion_ids):  # each policy turn is what the engine sampled for the sequence so far
            candidates = engine.sampled[tuple(x.prompt_ids + x.completion_ids[:start])]  # a group shares its opening
            c = next(c for c in candidates if x.completion_ids[start:start + len(c.token_ids)] == c.token_ids)
            assert x.loss_mask[start:start + len(c.token_ids)] == [1] * len(c.token_ids)
            assert x.behaviour_logprobs[start:start + len(c.token_ids)] == c.logprobs
            sampled_ids += c.token_ids
            start += len(c.token_ids)
            while start < len(x.completion_ids) and x.loss_mask[start] == 0:
                assert x.behaviour_logprobs[start] == 0.0
                start += 1
        assert x.num_generated == len(sampled_ids)
    for x in samples:
        x.reward = 0.0
    batch = collate(samples, [0, 0, 1, 1], tok.pad_token_id)
    for i, x in enumerate(samples):
        policy = batch.completion_mask[i] > 0  # position t predicts token t + 1
        targets = batch.input_ids[i, 1:][policy].tolist()
        assert targets == [t for t, m in zip(x.completion_ids, x.loss_mask) if m]
        assert batch.behaviour_logprobs[i][policy].tolist() == pytest.approx(
            [lp for lp, m in zip(x.behaviour_logprobs, x.loss_mask) if m])
        assert batch.completion_mask[i].sum() == x.num_generated


def test_single_turn_samples_collate_as_before():
    x = Sample(prompt_ids=[5, 6], completion_ids=[7, 8, 9], behaviour_logprobs=[-1.0, -2.0, -3.0], reward=1.0)
    batch = collate([x], [0], 0)
    assert batch.completion_mask.tolist() == [[0.0, 1.0, 1.0, 1.0]] and x.num_generated == 3


def test_max_turns_and_max_tokens_truncate_and_are_counted(tok):
    engine = FixedEngine(tok("ab", add_special_tokens=False)["input_ids"], tok.eos_token_id)
    x = run_episodes(engine, tok, rows(5), 1, SamplingParams(), Scripted(), Limits(max_turns=2))[0].samples[0]
    assert x.finish_reason == "length" and x.info["metrics"]["env/truncated_turns"] == 1.0
    assert x.info["turn_rewards"] == [1.0, 2.0] and x.excluded is None
    x = run_episodes(engine, tok, rows(5), 1, SamplingParams(), Scripted(), Limits(max_episode_tokens=20))[0].samples[0]
    assert x.finish_reason == "length" and x.info["metrics"]["env/truncated_tokens"] == 1.0
    assert len(x.completion_ids) <= 20 and x.loss_mask[-1] == 1  # it ends on the policy's tokens


class Faulty(Scripted):
    """Row "raise" raises, "hang" hangs, "junk" answers with a malformed step."""

    def step(self, reply, state):
        kind = state["kind"]
        if kind == "raise":
            raise RuntimeError("tool crashed")
        if kind == "hang":
            time.sleep(3)
        if kind == "junk":
            return Step([{"role": "user"}], 0.0, False)
        return super().step(reply, state)

    def reset(self, row, seed):
        messages, state = super().reset(row, seed)
        return messages, {**state, "kind": row["question"]}


def test_a_raising_hanging_or_malformed_env_excludes_only_its_episode(tok):
    engine = FixedEngine(tok("ab", add_special_tokens=False)["input_ids"], tok.eos_token_id)
    data = [{"uid": k, "question": k, "answer": "", "turns": 2} for k in ("raise", "hang", "junk", "ok")]
    groups = run_episodes(engine, tok, data, 1, SamplingParams(), Faulty(), Limits(step_timeout_s=0.3))
    reasons = {g.uid: g.samples[0].excluded for g in groups}
    assert "tool crashed" in reasons["raise"] and "timeout" in reasons["hang"] and "content" in reasons["junk"]
    assert reasons["ok"] is None
    assert [g.samples[0].info["metrics"]["env/error"] for g in groups] == [1.0, 1.0, 1.0, 0.0]


def test_user_environment_from_a_file(tmp_path, tok):
    path = tmp_path / "my_env.py"
    path.write_text("from lmrl.envs import Step\n"
                    "class Echo:\n"
                    "    def __init__(self, bonus=0.0):\n        self.bonus = bonus\n"
                    "    def reset(self, row, seed):\n        return [{'role': 'user', 'content': 'x'}], None\n"
                    "    def step(self, reply, state):\n        return Step(None, 1.0 + self.bonus, True)\n")
    env = build_env(f"{path}:Echo", {"bonus": 0.5})
    engine = FixedEngine([5], tok.eos_token_id)
    x = run_episodes(engine, tok, rows(1), 1, SamplingParams(), env, Limits())[0].samples[0]
    assert x.info["env_return"] == 1.5


def test_an_unknown_environment_is_a_config_error():
    from lmrl.config import ConfigError
    from lmrl.loading import load_config

    with pytest.raises(ConfigError, match="did you mean 'bandit'"):
        load_config("quickstart", ["env.name=bandt"])


def test_an_environment_without_the_env_reward_is_a_config_error():
    from lmrl.config import ConfigError
    from lmrl.loading import load_config

    with pytest.raises(ConfigError, match="no `env` component"):
        load_config("quickstart", ["env.name=bandit"])
    cfg = load_config("quickstart", ["env.name=bandit", "reward.components=[{name: env}]", "reward.accuracy_component=env"])
    assert cfg.env.name == "bandit"


class Attributed(Scripted):
    """Three turns; the last step attributes a win (R = 1) with turn 2 invalid and turn 3 ineligible (§1.17)."""

    def __init__(self, turn_rewards=None):
        self.override = turn_rewards

    def step(self, reply, state):
        step = super().step(reply, state)
        if step.done:
            info = delayed_attribution(1.0, valid=[True, False, True], eligible=[True, True, False])
            if self.override is not None:
                info["turn_rewards"] = self.override
            step.info = info
        return step


def test_delayed_attribution_with_eligibility_gating_by_hand(tok):
    from lmrl.algos.credit_assignment import turn_discounted
    from lmrl.inputs.credit import turn_reward_row

    engine = FixedEngine(tok("ab", add_special_tokens=False)["input_ids"], tok.eos_token_id)
    groups = run_episodes(engine, tok, rows(3), 2, SamplingParams(), Attributed(), Limits())
    x, y = groups[0].samples
    assert x.info["turn_rewards"] == [1.0, -0.5, 1.0] and x.info["turn_eligible"] == [True, True, False]
    assert x.info["env_return"] == 0.5  # the ineligible turn's reward leaves the return
    assert turn_reward_row(x) == [1.0, -0.5]  # spec §1.17: rewards [1, −0.5, masked]
    third = x.loss_mask[-3:]  # the last turn's 3 tokens ("ab" + EOS) are out of the loss
    assert third == [0, 0, 0] and x.num_generated == 6
    y.info["turn_rewards"], y.info["env_return"] = [1.0, 1.0, 1.0], 2.0  # as if y's turn 2 had been valid
    x.reward, y.reward = 0.5, 2.0
    batch = collate([x, y], [0, 0], tok.pad_token_id)
    per_turn = torch.tensor([turn_reward_row(x), turn_reward_row(y)])  # [[1, -0.5], [1, 1]]
    token_rewards = torch.zeros_like(batch.completion_mask)
    token_rewards[:, 0] = torch.tensor([x.reward, y.reward])  # the sequence reward = the eligible turns' sum
    adv = turn_discounted(token_rewards, batch.group_index, batch.completion_mask, turn_rewards=per_turn,
                          gamma=0.0, norm_by_std=False)
    mask = batch.completion_mask[0] > 0
    assert adv[0][mask].tolist() == [0.0] * 3 + [-0.75] * 3  # turn 1: 1 − 1; turn 2: −0.5 − mean(−0.5, 1)
    assert torch.all(adv[0][~mask] == 0)  # the ineligible third turn and the environment's tokens: no gradient


def test_a_malformed_attribution_excludes_the_episode(tok):
    engine = FixedEngine(tok("ab", add_special_tokens=False)["input_ids"], tok.eos_token_id)
    groups = run_episodes(engine, tok, rows(3), 1, SamplingParams(), Attributed(turn_rewards=[1.0]), Limits())
    x = groups[0].samples[0]
    assert x.excluded is not None and "turn_rewards" in x.excluded and x.info["metrics"]["env/error"] == 1.0
