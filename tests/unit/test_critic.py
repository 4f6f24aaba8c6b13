"""GAE and the clipped value loss (verl), EVPO (docs/methods/evpo.md), the critic inside the Algorithm,
and the config checks of estimators, losses and presets."""
import math

import pytest
import torch

from lmrl.algos import ADVANTAGES, Algorithm
from lmrl.algos.advantages import masked_whiten
from lmrl.algos.critic import clipped_value_loss, explained_variance, gae_advantages_returns
from lmrl.algos.losses import LossInputs
from lmrl.config import AlgoConfig, ConfigError
from lmrl.loading import build_config
from lmrl.validation import check_names
from lmrl.types import Batch


def t(x):
    return torch.tensor(x, dtype=torch.float)


def _one_group_batch():
    mask = t([[0, 1, 1], [0, 1, 1]])
    return Batch(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), mask, torch.zeros(2, 3),
                 t([1, 0]), torch.tensor([0, 0]))


def test_gae_hand_values_gamma_one_and_lambda_half():
    rewards, values, mask = t([[0, 0, 1]]), t([[0.5, 0.6, 0.7]]), torch.ones(1, 3)
    adv, ret = gae_advantages_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.5, 0.4, 0.3])
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 1.0])  # λ = 1: the Monte-Carlo return
    adv, ret = gae_advantages_returns(rewards, values, mask, gamma=1.0, lam=0.5)
    assert adv[0].tolist() == pytest.approx([0.225, 0.25, 0.3])
    assert ret[0].tolist() == pytest.approx([0.725, 0.85, 1.0])


def test_gae_skips_masked_positions_and_discounts():
    # the middle position is not generated: its value is ignored and it does not break the chain
    rewards, values, mask = t([[0, 0, 1]]), t([[0.5, 9.0, 0.7]]), t([[1, 0, 1]])
    adv, _ = gae_advantages_returns(rewards, values, mask, gamma=0.9, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.9 * 1 - 0.5, 0.0, 0.3])


def test_gae_estimator_whitens_over_valid_tokens():
    rewards, values, mask = t([[0, 1], [0, 0]]), t([[0.2, 0.5], [0.1, 0.3]]), t([[1, 1], [1, 0]])
    raw, _ = gae_advantages_returns(rewards, values, mask)
    out = ADVANTAGES.get("gae")(rewards, torch.tensor([0, 0]), mask, values=values)
    assert torch.allclose(out, masked_whiten(raw, mask))
    assert ADVANTAGES.spec("gae").requires == {"values"} and ADVANTAGES.spec("gae").critic
    with pytest.raises(ValueError, match="values"):
        ADVANTAGES.get("gae")(rewards, torch.tensor([0, 0]), mask)


def test_clipped_value_loss_takes_the_larger_of_clipped_and_unclipped():
    loss, clipped = clipped_value_loss(t([1.0, 0.2]), t([0.0, 0.0]), t([1.0, 1.0]), value_clip=0.5)
    # V=1 moved 1.0 from V_old=0: clip gives 0.5 → ½(0.5−1)² = 0.125 > ½(1−1)² = 0
    assert loss.tolist() == pytest.approx([0.125, 0.32])
    assert clipped.tolist() == [1.0, 0.0]
    loss, _ = clipped_value_loss(t([1.0]), t([0.0]), t([0.0]), value_clip=None)
    assert loss.tolist() == pytest.approx([0.5])


def test_evpo_spec_critic_branch():
    returns, mask = t([[1], [0], [1], [0]]), torch.ones(4, 1)
    values = t([[0.9], [0.1], [0.6], [0.4]])
    assert explained_variance(returns, values, mask) == pytest.approx(0.66, abs=1e-6)
    out = ADVANTAGES.get("evpo")(returns, torch.zeros(4), mask, values=values)
    assert torch.allclose(out, masked_whiten(returns - values, mask))  # GAE with γ=λ=1 on one token
    assert out[:, 0].tolist() == pytest.approx([0.2970, -0.2970, 1.1882, -1.1882], abs=1e-4)


def test_evpo_spec_baseline_branch():
    returns, mask = t([[1], [0], [1], [0]]), torch.ones(4, 1)
    values = t([[0], [1], [0], [1]])
    assert explained_variance(returns, values, mask) == pytest.approx(-3.0)
    out = ADVANTAGES.get("evpo")(returns, torch.zeros(4), mask, values=values)
    assert out[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])


def test_evpo_without_reward_variance_takes_the_baseline_branch():
    returns, mask = t([[1], [1]]), torch.ones(2, 1)
    assert math.isnan(explained_variance(returns, t([[0.2], [0.9]]), mask))
    out = ADVANTAGES.get("evpo")(returns, torch.zeros(2), mask, values=t([[0.2], [0.9]]))
    assert out.abs().sum() == 0


def test_algorithm_with_a_critic_sets_value_targets_and_adds_the_value_loss():
    algo = Algorithm(AlgoConfig(advantage="gae", critic=True, value_clip=None, value_coef=2.0), max_new_tokens=2)
    assert algo.prepare_outputs == {"values"} and algo.needs == {"values"}
    batch = _one_group_batch()
    batch.extras["values"] = t([[0, 0.5, 0.5], [0, 0.5, 0.5]])
    metrics = algo.prepare(batch)
    assert batch.extras["returns"][:, 1:].tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert "values" not in batch.extras and "old_values" in batch.extras
    assert metrics["critic/explained_variance"] == pytest.approx(0.0)
    assert not algo.inert_rows(batch).any()
    logp = torch.zeros(2, 3, requires_grad=True)
    values = batch.extras["old_values"].clone().requires_grad_(True)
    x = LossInputs(logp, logp.detach(), batch.advantages, batch.completion_mask,
                   extras={**batch.extras, "values": values})
    total, m = algo.objective(x, algo.scale(batch.completion_mask))
    pg, _ = Algorithm(AlgoConfig(), 2).objective(x, algo.scale(batch.completion_mask))
    assert float((total - pg).detach()) == pytest.approx(2.0 * 0.5 * 0.25)  # every |V − R| = 0.5 over 4 tokens
    assert m["critic/value_loss"] == pytest.approx(0.125)


def test_critic_settings_must_match_the_estimator_and_name_both():
    with pytest.raises(ConfigError, match=r"algo.advantage=gae.*algo.critic=false"):
        check_names(build_config({"algo": {"advantage": "gae"}}))
    with pytest.raises(ConfigError, match=r"algo.critic=true.*algo.advantage=grpo"):
        check_names(build_config({"algo": {"critic": True}}))
    check_names(build_config({"algo": {"preset": "ppo"}}))
    check_names(build_config({"algo": {"preset": "evpo"}}))


def test_knobs_a_loss_would_ignore_fail_at_config_time():
    with pytest.raises(ConfigError, match=r"algo.loss_params: unknown param 'mis_token_low' of policy loss 'gspo'"):
        check_names(build_config({"algo": {"preset": "gspo", "loss_params": {"mis_token_low": 0.5}}}))
    with pytest.raises(ConfigError, match=r"algo.advantage_params.*lamda"):
        check_names(build_config({"algo": {"preset": "ppo", "advantage_params": {"lamda": 0.9}}}))
    check_names(build_config({"algo": {"preset": "ppo", "advantage_params": {"lam": 0.9, "gamma": 0.99}}}))


def test_every_preset_has_a_description():
    from lmrl.presets import PRESETS

    assert all(PRESETS.describe(name) for name in PRESETS)
    assert {"ppo", "evpo", "resrl", "gdpo", "rvpo", "entrocraft", "eqlen", "xgrpo", "alpo", "prpo"} <= set(PRESETS)


def test_gspo_preset_bounds_with_a_token_ratio_loss_fail_at_config_time():
    with pytest.raises(ConfigError, match=r"algo.preset=gspo.*algo.loss=ppo_clip_mis_token"):
        build_config({"algo": {"preset": "gspo", "loss": "ppo_clip_mis_token"}})
    cfg = build_config({"algo": {"preset": "gspo", "loss": "ppo_clip_mis_token", "eps_low": 0.2, "eps_high": 0.2}})
    assert cfg.algo.eps_low == 0.2
    build_config({"algo": {"preset": "gspo", "eps_low": 0.2, "eps_high": 0.2}})
