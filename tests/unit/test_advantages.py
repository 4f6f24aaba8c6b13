"""Advantage estimators against the hand-computed values of specs/algorithms.md §0."""
import pytest
import torch

from lmrl.algos.advantages import ADVANTAGES, group_mean_std, outcome_to_token_rewards


def seq_adv(name, rewards, groups=None, **kw):
    r = torch.tensor(rewards, dtype=torch.float)
    mask = torch.ones(len(rewards), 3)
    g = torch.tensor(groups or [0] * len(rewards))
    adv = ADVANTAGES.get(name)(outcome_to_token_rewards(r, mask), g, mask, **kw)
    assert torch.allclose(adv, adv[:, :1].expand_as(adv))  # broadcast to every token
    return adv[:, 0]


def test_grpo_spec_value():
    assert seq_adv("grpo", [1, 0, 0, 1]).tolist() == pytest.approx([0.866, -0.866, -0.866, 0.866], abs=1e-3)


def test_dr_grpo_spec_value():
    assert seq_adv("dr_grpo", [1, 0, 0, 1]).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_rloo_spec_value():
    assert seq_adv("rloo", [1, 0, 0, 1]).tolist() == pytest.approx([0.667, -0.667, -0.667, 0.667], abs=1e-3)


def test_groups_are_independent():
    adv = seq_adv("grpo", [1, 0, 5, 5], groups=[0, 0, 1, 1])
    assert adv.tolist() == pytest.approx([0.7071, -0.7071, 0.0, 0.0], abs=1e-4)


def test_singleton_group_has_mean_zero_std_one():
    mean, std = group_mean_std(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert mean.tolist() == pytest.approx([0.0, 1.5, 1.5])
    assert std[0].item() == 1.0
    assert seq_adv("grpo", [3.0], eps=0.0).tolist() == pytest.approx([3.0])


def test_reinforce_pp_baseline_spec_value():
    r = torch.tensor([1.0, 0.0])
    mask = torch.ones(2, 1)
    adv = ADVANTAGES.get("reinforce_pp_baseline")(outcome_to_token_rewards(r, mask), torch.tensor([0, 0]), mask)
    assert adv.squeeze(1).tolist() == pytest.approx([0.707, -0.707], abs=1e-3)


def test_reinforce_pp_return_to_go_spec_value():
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = ADVANTAGES.get("reinforce_pp")(token_rewards, torch.tensor([0, 1]), mask, gamma=1.0)
    assert adv[0].tolist() == pytest.approx([0.730, 0.730, 0.730], abs=1e-3)
    assert adv[1, :2].tolist() == pytest.approx([-1.095, -1.095], abs=1e-3)
    assert adv[1, 2].item() == 0.0


def test_outcome_reward_lands_on_last_valid_token():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    tr = outcome_to_token_rewards(torch.tensor([2.0, 5.0]), mask)
    assert tr.tolist() == [[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def test_advantages_are_zero_outside_the_mask():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = ADVANTAGES.get("grpo")(outcome_to_token_rewards(torch.tensor([1.0, 0.0]), mask), torch.tensor([0, 0]), mask)
    assert adv[0, 2] == 0 and adv[1, 1] == 0 and adv[0, 0] > 0
