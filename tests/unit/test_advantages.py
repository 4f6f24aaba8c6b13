"""Baseline estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++, XGRPO, PRPO) against the hand-computed
checks of docs/methods/{grpo,dr_grpo,rloo,reinforce_pp,xgrpo,prpo}.md, and the inputs every estimator names."""
import math

import pytest
import torch

from algo_helpers import run_estimator as run
from algo_helpers import seq
from lmrl.algos.advantages import ADVANTAGES, outcome_to_token_rewards
from lmrl.stats import group_mean_std


def seq_adv(name, rewards, groups=None, **kw):
    r = torch.tensor(rewards, dtype=torch.float)
    mask = torch.ones(len(rewards), 3)
    g = torch.tensor(groups or [0] * len(rewards))
    adv = ADVANTAGES.get(name)(outcome_to_token_rewards(r, mask), g, mask, **kw)
    assert torch.allclose(adv, adv[:, :1].expand_as(adv))  # broadcast to every token
    return adv[:, 0]


# estimators that read per-sample inputs (eqlen's pair ids are optional)
INPUT_ESTIMATORS = ["alpo", "entrocraft", "eqlen", "gdpo", "p_grpo", "prpo", "rvpo", "xgrpo"]


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
    # a row without a valid token keeps its reward on its last (masked) position: group baselines count it
    assert tr.tolist() == [[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 5.0]]


def test_advantages_are_zero_outside_the_mask():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = ADVANTAGES.get("grpo")(outcome_to_token_rewards(torch.tensor([1.0, 0.0]), mask), torch.tensor([0, 0]), mask)
    assert adv[0, 2] == 0 and adv[1, 1] == 0 and adv[0, 0] > 0


def test_all_registered():
    assert set(INPUT_ESTIMATORS) <= set(ADVANTAGES.names())


@pytest.mark.parametrize("name", [n for n in INPUT_ESTIMATORS if n != "eqlen"])  # eqlen needs no extra input
def test_missing_required_input_is_named(name):
    with pytest.raises(ValueError, match="per-sample input"):
        run(name, [1, 0])


def test_xgrpo_spec_value():
    adv = run("xgrpo", [1, 0], peer_rewards=torch.tensor([[1.0, 1.0], [1.0, 1.0]]))
    assert seq(adv) == pytest.approx([0.5, -1.5], abs=1e-4)


def test_xgrpo_groups_missing_peers_and_singletons():
    peers = torch.tensor([[1.0, 1.0], [1.0, 1.0], [math.nan, math.nan], [math.nan, math.nan], [0.0, math.nan]])
    adv = seq(run("xgrpo", [1, 0, 1, 0, 1], groups=[0, 0, 1, 1, 2], peer_rewards=peers))
    plain = seq(run("grpo", [1, 0]))
    assert adv[:2] == pytest.approx([0.5, -1.5], abs=1e-4)
    assert adv[2:4] == pytest.approx(plain, abs=1e-6)  # no peers: GRPO
    assert adv[4] == pytest.approx(0.7071, abs=1e-4)  # pool {1 own, 0 peer}
    lone = seq(run("xgrpo", [3.0], peer_rewards=torch.tensor([[math.nan]]), eps=0.0))
    assert lone == pytest.approx([3.0])  # pool of one: mean 0, std 1


def test_prpo_spec_value():
    adv = seq(run("prpo", [1, 0, 0, 0], perm_index=torch.tensor([0, 0, 1, 1]), lam=1.0))
    assert adv == pytest.approx([1.414, 0.0, -0.707, -0.707], abs=1e-3)
    a_in = seq(run("prpo", [1, 0, 0, 0], perm_index=torch.tensor([0, 0, 1, 1]), lam=0.0))
    assert a_in == pytest.approx([0.707, -0.707, 0.0, 0.0], abs=1e-3)


def test_prpo_single_permutation_is_grpo_and_samples_are_independent():
    perms = torch.tensor([0, 0, 1, 1, 0, 1])
    adv = seq(run("prpo", [1, 0, 0, 1, 0, 0], groups=[0, 0, 0, 0, 1, 1], perm_index=torch.tensor([0, 0, 0, 0, 0, 1])))
    assert adv[:4] == pytest.approx(seq(run("grpo", [1, 0, 0, 1])), abs=1e-6)
    two = seq(run("prpo", [1, 0, 0, 0, 1, 0], groups=[0, 0, 0, 0, 1, 1], perm_index=perms))
    assert two[:4] == pytest.approx([1.414, 0.0, -0.707, -0.707], abs=1e-3)
