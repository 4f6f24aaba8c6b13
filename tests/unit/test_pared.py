"""PARED: the discriminator's pure functions on the spec's numbers (§5.5), and the `pared` group reward:
scores then updates, resumes from its saved state, reads nothing of a reply but the reply."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from conftest import make_tokenizer
from lmrl.errors import ConfigError
from lmrl.loading import load_config
from lmrl.rewards import GROUP_REWARD_FNS, RewardScorer
from lmrl.config import RewardConfig
from lmrl.rewards.pared import (PARED, argmax_r, discriminator_gradient, discriminator_loss, discriminator_probability,
                                discriminator_update, pared_logits)
from lmrl.types import Group, Origin, Sample

W, DEMO, POLICY = np.array([1.0, -0.5]), np.array([[0.8, 0.4]]), np.array([[0.2, 0.6]])
FEATURES = [{"name": "reply_tokens", "params": {"max": 20}}, {"name": "format"}]


def test_the_spec_values():
    assert pared_logits(DEMO, W, 0.0)[0] == pytest.approx(0.6)
    assert pared_logits(POLICY, W, 0.0)[0] == pytest.approx(-0.1)
    assert discriminator_probability(pared_logits(DEMO, W, 0.0))[0] == pytest.approx(0.6457, abs=1e-4)
    assert discriminator_loss(W, 0.0, DEMO, POLICY, l2=0.0) == pytest.approx(1.0819, abs=1e-4)
    assert discriminator_loss(W, 0.0, DEMO, POLICY, l2=0.1) == pytest.approx(1.0819 + 0.1 * 1.25, abs=1e-4)


def test_each_class_weighs_the_same_whatever_its_count():
    assert discriminator_loss(W, 0.0, np.repeat(DEMO, 3, 0), POLICY) == pytest.approx(1.0819, abs=1e-4)


def test_the_gradient_is_the_loss_derivative():
    demos, policy, l2 = np.array([[0.8, 0.4], [0.1, 0.9]]), np.array([[0.2, 0.6], [0.5, 0.5], [1.0, 0.0]]), 0.3
    grad_w, grad_b = discriminator_gradient(W, 0.2, demos, policy, l2)
    eps = 1e-6
    for i in range(2):
        step = np.eye(2)[i] * eps
        numeric = (discriminator_loss(W + step, 0.2, demos, policy, l2)
                   - discriminator_loss(W - step, 0.2, demos, policy, l2)) / (2 * eps)
        assert grad_w[i] == pytest.approx(numeric, abs=1e-6)
    numeric_b = (discriminator_loss(W, 0.2 + eps, demos, policy, l2)
                 - discriminator_loss(W, 0.2 - eps, demos, policy, l2)) / (2 * eps)
    assert grad_b == pytest.approx(numeric_b, abs=1e-6)


def test_one_update_by_hand():
    # dL/dr: demo -(1 - 0.6457) = -0.35434, policy sigma(-0.1) = 0.47502
    w, b, _ = discriminator_update(W, 0.0, DEMO, POLICY, steps=1, lr=0.1, optimizer="sgd")
    assert w == pytest.approx([1.0 + 0.1 * 0.188471, -0.5 - 0.1 * 0.143275], abs=1e-6)
    assert b == pytest.approx(-0.1 * 0.120677, abs=1e-6)
    # Adam's first step moves each parameter by lr against the sign of its gradient
    w, b, state = discriminator_update(W, 0.0, DEMO, POLICY, steps=1, lr=0.1, optimizer="adam")
    assert w == pytest.approx([1.1, -0.6], abs=1e-6) and b == pytest.approx(-0.1, abs=1e-6)
    assert state["t"] == 1
    more, _, _ = discriminator_update(W, 0.0, DEMO, POLICY, steps=3, lr=0.1)
    again, _, _ = discriminator_update(W, 0.0, DEMO, POLICY, steps=3, lr=0.1)
    assert np.array_equal(more, again)  # deterministic


def test_argmax_r_reranks():
    candidates = np.array([[0.2, 0.6], [0.8, 0.4], [0.5, 0.5]])  # r = -0.1, 0.6, 0.25
    assert argmax_r(candidates, W, 0.0) == 1
    assert argmax_r(np.array([[0.0, 0.0], [0.0, 0.0]]), W, 0.0) == 0  # ties: the first


# --- the group reward ---------------------------------------------------------------------------

TOK = make_tokenizer()


def reply(text: str, row: dict, origin: Origin = Origin.SAMPLED) -> Sample:
    ids = TOK(text, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
    return Sample(prompt_ids=[1, 2], completion_ids=ids, behaviour_logprobs=[-1.0] * len(ids), text=text, row=row,
                  origin=origin)


def rows(n: int) -> list[dict]:
    return [{"uid": f"r{i}", "question": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def group_of(row: dict) -> list[Sample]:
    """Replies unlike the demonstrations: long, and no 'Answer:' line."""
    return [reply(f"well {row['question']} is hard to say " + "la " * k, row) for k in range(4)]


def pared(**knobs) -> PARED:
    return PARED(**({"features": FEATURES, "tokenizer": TOK, "demonstration": "Answer: {answer}", "disc_steps": 3,
                     "lr": 0.1, "demos_per_update": 4} | knobs))


def test_scores_with_the_current_weights_then_learns_the_demonstrations_apart():
    reward = pared()
    first = reward(group_of(rows(1)[0]))
    assert first == [0.0] * 4  # w = 0, b = 0 before any update
    for row in rows(6):
        scored = group_of(row)
        reward(scored)
    weights = scored[0].info["pared"]["weights"]
    assert set(weights) == {"reply_tokens", "format", "bias"}
    assert reward.weights()["format"] > 0 > reward.weights()["reply_tokens"]  # demos: short, with 'Answer:'
    assert scored[0].info["pared"]["updates"] == 7 and scored[0].info["pared"]["demos"] == 6
    assert scored[0].info["pared"]["D"] == pytest.approx(1 / (1 + np.exp(-scored[0].info["pared"]["logit"])))


def test_a_resumed_reward_scores_and_updates_as_the_uninterrupted_one():
    reward = pared()
    for row in rows(3):
        reward(group_of(row))
    saved = copy.deepcopy(reward.reward_state())
    fresh = pared()
    fresh.load_reward_state(saved)
    for row in rows(5)[3:]:
        assert reward(group_of(row)) == fresh(group_of(row))
    assert reward.reward_state() == fresh.reward_state()


def test_the_scorer_saves_and_restores_it():
    cfg = RewardConfig(components=[{"name": "pared", "params": {"features": FEATURES, "tokenizer": TOK,
                                                                "demonstration": "Answer: {answer}"}}],
                       accuracy_component="pared")
    a, b = RewardScorer(cfg), RewardScorer(cfg)
    row = rows(1)[0]
    a.score([Group(uid="g", row=row, samples=group_of(row))])
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert b.state_dict() == a.state_dict() and a.state_dict()["pared"]["updates"] == 1


def test_a_reply_copying_nothing_scores_below_a_demo_like_one():
    reward = pared(disc_steps=10)
    for row in rows(8):
        reward(group_of(row))
    row = rows(20)[15]
    demo_like = reply("Answer: 3", row)
    copying_nothing = [reply(text, row) for text in ("answer", "3", "", "la la la la la la la la la la la la la")]
    scores = reward([demo_like, *copying_nothing])
    assert all(s < scores[0] for s in scores[1:]), scores
    assert reward.rerank([*copying_nothing, demo_like]) is demo_like


def test_a_reply_reaches_the_state_only_as_a_negative_example():
    reward = pared()
    row = rows(1)[0]
    mimic = [reply("Answer: 1", row), reply("Answer: 1", row, origin=Origin.DEMONSTRATION)]
    mimic[0].info["answer"], mimic[0].rewards["format"] = "1", 1.0
    reward(mimic)
    assert list(reward.pool) == ["row:r0:what is 0 + 1?"]  # the row's reference, not a reply
    state = reward.reward_state()
    # the demonstration-origin sample is no negative, and what a reply carries beside itself (info, other
    # components' rewards) changes nothing: the state is the one the sampled reply alone leaves
    alone = pared()
    alone([reply("Answer: 1", row)])
    assert alone.reward_state()["w"] == state["w"]


def test_features_see_the_reply_alone():
    reward = pared(features=[{"name": "answer"}])  # the gold answer is not shown to features
    with pytest.raises(ValueError, match="reads 'answer' of the task row"):
        reward(group_of(rows(1)[0]))


def test_a_file_of_demonstrations(tmp_path):
    path = tmp_path / "demos.jsonl"
    path.write_text('{"text": "Answer: 5"}\n{"text": "Answer: 12"}\n')
    reward = pared(demonstration=None, demonstrations_file=str(path))
    assert list(reward.pool) == ["file:0", "file:1"]
    assert reward.pool["file:0"] == pytest.approx([(len("Answer: 5") + 1) / 20, 1.0])  # tokens (one a char) + EOS
    reward(group_of({"question": "q"}))
    assert reward.weights()["format"] > 0


@pytest.mark.parametrize("knobs, message", [
    ({"features": [{"name": "lenght"}]}, "neither reply_tokens nor a registered"),
    ({"features": [{"name": "majority_vote"}]}, "scores whole groups"),
    ({"features": []}, "at least one feature"),
    ({"demonstration": None}, "needs demonstrations"),
    ({"demonstrations_file": "demos.jsonl"}, "needs demonstrations"),
    ({"lr": 0.0}, "lr > 0"),
    ({"features": [{"name": "format"}, "format"]}, "distinct labels"),
    ({"features": [{"name": "reply_tokens", "params": {"maximum": 3}}]}, "takes one param, max"),
])
def test_bad_params_are_refused_with_the_reason(knobs, message):
    with pytest.raises(ValueError, match=message):
        pared(**knobs)


def test_the_config_check_refuses_them_before_any_model_loads():
    assert "pared" in GROUP_REWARD_FNS
    load_config("pared")
    with pytest.raises(ConfigError, match=r"reward.components\[0\].params.*neither reply_tokens"):
        load_config("pared", ["reward.components.pared.params.features=[{name: lenght}]"])
    with pytest.raises(ConfigError, match="needs demonstrations"):
        load_config("pared", ["reward.components.pared.params.demonstration=null"])
    with pytest.raises(ConfigError, match="did you mean 'disc_steps'"):
        load_config("pared", ["reward.components.pared.params.disc_step=3"])


def test_an_evaluation_scores_without_learning():
    """The scorer scores an evaluation's groups `held_out`: PARED's weights, pool and update count stay."""
    cfg = RewardConfig(components=[{"name": "pared", "params": {"features": FEATURES, "tokenizer": TOK,
                                                                "demonstration": "Answer: {answer}"}}],
                       accuracy_component="pared")
    scorer = RewardScorer(cfg)
    first, second = rows(2)
    scorer.score([Group(uid="g", row=first, samples=group_of(first))])
    state = copy.deepcopy(scorer.state_dict())
    scored = group_of(second)
    scorer.score([Group(uid="e", row=second, samples=scored)], held_out=True)
    after = scorer.state_dict()
    assert after["pared"]["updates"] == state["pared"]["updates"] == 1
    assert np.array_equal(after["pared"]["w"], state["pared"]["w"]) and len(after["pared"]["pool"]) == 1
    assert scorer.components[0].instance.held_out is False and scored[0].info["pared"]["updates"] == 1
