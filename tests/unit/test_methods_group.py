"""GEPO, Policy Split, GFT and HARGO against specs/algorithms.md §12, §13, §15, §17 and against values
computed by hand or with numpy, independently of the implementation."""
import math

import numpy as np
import pytest
import torch

from lmrl.algos import ADVANTAGES, LOSSES, LossInputs
from lmrl.algos.advantages import outcome_to_token_rewards
from lmrl.algos.methods_group import (
    GroupEntropyStats,
    gepo_shape,
    group_softmax_weights,
    group_token_mean,
    hargo_modulate,
    sequence_confidence,
)
from lmrl.config import build_config
from lmrl.loops.build import check_names

SQRT_HALF = math.sqrt(0.5)  # GRPO advantage of rewards [1, 0]: ±0.5 / std([1, 0]) = ±0.7071


def adv(name, rewards, groups, width=2, mask=None, **kw):
    mask = torch.ones(len(rewards), width) if mask is None else mask
    tr = outcome_to_token_rewards(torch.tensor(rewards, dtype=torch.float), mask)
    return ADVANTAGES.get(name)(tr, torch.tensor(groups), mask, **kw)


def loss_inputs(logp, adv_values, mask=None, entropy=None, old_logp=None, **extras):
    lp = torch.tensor(logp, dtype=torch.float, requires_grad=True)
    a = torch.tensor(adv_values, dtype=torch.float)
    a = a.unsqueeze(1).expand_as(lp).clone() if a.dim() == 1 else a
    m = torch.ones_like(lp) if mask is None else torch.tensor(mask, dtype=torch.float)
    ent = None if entropy is None else torch.tensor(entropy, dtype=torch.float, requires_grad=True)
    old = lp.detach().clone() if old_logp is None else torch.tensor(old_logp, dtype=torch.float)
    ex = {k: torch.tensor(v, dtype=torch.float) for k, v in extras.items()}
    return lp, ent, LossInputs(logp=lp, old_logp=old, advantages=a, mask=m, entropy=ent, extras=ex)


# --- GEPO (spec §12) ------------------------------------------------------------------------------


@pytest.mark.parametrize("h, expected", [(0.7, [0.5, -1.0]), (1.3, [1.0, -0.5]), (1.0, [1.0, -1.0])])
def test_gepo_spec_shaping(h, expected):
    a = torch.tensor([1.0, -1.0])
    out = gepo_shape(a, torch.full((2,), h), entropy_mean=1.0, entropy_std=0.2, kappa=1.0, alpha=0.5)
    assert out.tolist() == pytest.approx(expected)


def test_gepo_estimator_with_history_statistics():
    mask = torch.ones(6, 3)
    entropy = torch.tensor([0.7, 0.7, 1.3, 1.3, 1.0, 1.0]).unsqueeze(1).expand(6, 3)
    out = adv("gepo", [1, 0, 1, 0, 1, 0], [0, 0, 1, 1, 2, 2], width=3, mask=mask, token_entropy=entropy,
              entropy_mean=1.0, entropy_std=0.2)
    s = SQRT_HALF
    assert out[:, 0].tolist() == pytest.approx([0.5 * s, -s, s, -0.5 * s, s, -s], abs=1e-5)
    assert torch.equal(out, out[:, :1].expand_as(out))


def test_gepo_without_history_uses_this_batch_of_groups():
    entropy = torch.tensor([0.6, 0.6, 1.4, 1.4, 1.0, 1.0]).unsqueeze(1).expand(6, 2)
    h = np.array([0.6, 1.4, 1.0])
    assert h.std(ddof=1) == pytest.approx(0.4)  # thresholds 1 ± 0.5·0.4 = [0.8, 1.2]
    out = adv("gepo", [1, 0, 1, 0, 1, 0], [0, 0, 1, 1, 2, 2], token_entropy=entropy, kappa=0.5, alpha=0.25)
    s = SQRT_HALF
    assert out[:, 0].tolist() == pytest.approx([0.25 * s, -s, s, -0.25 * s, s, -s], abs=1e-5)


def test_group_entropy_is_token_weighted_over_the_group():
    values = torch.tensor([[1.0, 1.0, 1.0], [4.0, 9.0, 9.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    out = group_token_mean(values, torch.tensor([5, 5, 2]), mask)
    assert out.tolist() == pytest.approx([7 / 4, 7 / 4, 2.0])


def test_group_entropy_stats_exponential_history():
    stats = GroupEntropyStats(decay=0.5)
    assert stats.mean is None and stats.std == 0.0
    stats.update(torch.tensor([1.0, 3.0]))  # one batch: both groups weigh 1
    assert (stats.mean, stats.std) == (pytest.approx(2.0), pytest.approx(1.0))
    stats.update(torch.tensor([2.0]))
    # S₀ = 0.5·2 + 1 = 2, S₁ = 0.5·4 + 2 = 4, S₂ = 0.5·10 + 4 = 9 → mean 2, var 9/2 − 4 = 0.5
    assert stats.mean == pytest.approx(2.0) and stats.std == pytest.approx(0.5 ** 0.5)
    copy = GroupEntropyStats(decay=0.5)
    copy.load_state_dict(stats.state_dict())
    copy.update(torch.tensor([3.0]))
    stats.update(torch.tensor([3.0]))
    assert (copy.mean, copy.std) == (stats.mean, stats.std)


def test_gepo_missing_entropy_bad_alpha_and_the_config_check():
    with pytest.raises(ValueError, match="token_entropy"):
        adv("gepo", [1, 0], [0, 0])
    with pytest.raises(ValueError, match="alpha"):
        gepo_shape(torch.ones(2), torch.ones(2), 1.0, 0.1, alpha=1.5)
    check_names(build_config({"algo": {"advantage": "gepo", "advantage_params": {"entropy_decay": 0.9}}}))


# --- Policy Split (spec §13) ----------------------------------------------------------------------


def test_policy_split_spec_pooled_advantages():
    # normal-mode rewards [1, 0] and high-entropy-mode rewards [1, 1] share the prompt's group
    out = adv("grpo", [1, 0, 1, 1], [0, 0, 0, 0])
    assert out[:, 0].tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5], abs=1e-5)


def test_policy_split_spec_entropy_term_on_high_entropy_rows_only():
    lp, ent, x = loss_inputs([[-1.0], [-1.0]], [0.0, 0.0], entropy=[[2.0], [2.0]], prompt_variant=[0.0, 1.0])
    loss, m = LOSSES.get("policy_split")(x, split_beta=0.01)
    assert loss[:, 0].tolist() == pytest.approx([0.0, -0.02])
    loss.sum().backward()
    assert ent.grad[:, 0].tolist() == pytest.approx([0.0, -0.01])
    assert m["split/high_entropy_rows"] == 0.5
    assert m["split/high_mode_entropy"] == pytest.approx(2.0)


def test_policy_split_keeps_the_ppo_clip_on_every_row():
    lp, _, x = loss_inputs([[0.0, 0.0]], [1.0], entropy=[[1.0, 3.0]], old_logp=[[0.0, -0.5]], prompt_variant=[1.0])
    loss, m = LOSSES.get("policy_split")(x, eps_low=0.2, eps_high=0.2, split_beta=0.1)
    # token 2: ρ = e^0.5 = 1.65 is clipped at 1.2
    assert loss[0].tolist() == pytest.approx([-1.0 - 0.1, -1.2 - 0.3], abs=1e-5)
    assert m["clip_frac"] == 0.5


def test_policy_split_inputs_prompt_and_config_check():
    fn = LOSSES.get("policy_split")
    assert fn.needs_entropy and fn.requires == {"prompt_variant"}
    _, _, x = loss_inputs([[0.0]], [1.0])
    with pytest.raises(ValueError, match="entropy"):
        fn(x)
    _, _, x = loss_inputs([[0.0]], [1.0], entropy=[[1.0]])
    with pytest.raises(ValueError, match="prompt_variant"):
        fn(x)


# --- GFT (spec §15) -------------------------------------------------------------------------------


@pytest.mark.parametrize("prob, weight", [(0.01, 10.0), (0.05, 10.0), (0.5, 2.0)])
def test_gft_spec_weight_on_grad_pi_is_capped_at_one_over_tau(prob, weight):
    pi = torch.tensor([[prob]], requires_grad=True)
    logp = torch.log(pi)
    x = LossInputs(logp=logp, old_logp=logp.detach(), advantages=torch.ones(1, 1), mask=torch.ones(1, 1))
    loss, m = LOSSES.get("gft")(x, gft_tau=0.1)
    loss.sum().backward()
    assert -pi.grad.item() == pytest.approx(weight, rel=1e-5)  # plain SFT/PG: 1/π = 100, 20, 2
    assert m["gft/rectified_frac"] == float(prob < 0.1)


def test_gft_spec_group_advantages():
    assert adv("grpo", [1, 0, 0, 0], [0] * 4)[:, 0].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    # the leave-one-out reading of "unbiased"
    assert adv("rloo", [1, 0, 0, 0], [0] * 4)[:, 0].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_gft_tau_from_a_quantile_of_the_tokens_with_an_advantage():
    probs = [0.1, 0.2, 0.4, 0.8, 0.01]
    lp, _, x = loss_inputs([[math.log(p) for p in probs]], [[1.0, 1.0, -1.0, 1.0, 0.0]])
    loss, m = LOSSES.get("gft")(x, gft_tau_quantile=0.5)
    tau = np.quantile(probs[:4], 0.5)  # 0.3; the A = 0 token does not count
    assert m["gft/tau"] == pytest.approx(tau)
    coef = np.minimum(1.0, np.array(probs) / tau)
    expected = -coef * np.array([1.0, 1.0, -1.0, 1.0, 0.0]) * np.log(probs)
    assert loss[0].tolist() == pytest.approx(expected.tolist(), rel=1e-5)


def test_gft_bad_knobs():
    _, _, x = loss_inputs([[-1.0]], [1.0])
    with pytest.raises(ValueError, match="gft_tau"):
        LOSSES.get("gft")(x, gft_tau=0.0)
    with pytest.raises(ValueError, match="gft_tau_quantile"):
        LOSSES.get("gft")(x, gft_tau_quantile=1.5)


# --- HARGO (spec §17) -----------------------------------------------------------------------------


def test_hargo_spec_modulation_and_weights():
    out = hargo_modulate(torch.tensor([1.0, -1.0]), 0.5, torch.tensor([0.9, 0.1]), lam=1.0)
    assert out.tolist() == pytest.approx([1.05, -1.45])
    w = group_softmax_weights(out.abs(), torch.tensor([0, 0]), temperature=1.0)
    e = np.exp([1.05, 1.45])
    assert w.tolist() == pytest.approx((2 * e / e.sum()).tolist(), rel=1e-6)  # [0.8026, 1.1974]


def test_group_softmax_weights_average_one_within_each_group():
    scores = torch.tensor([3.0, 1.0, 0.5, 2.0, 2.0])
    groups = torch.tensor([0, 1, 0, 1, 2])
    w = group_softmax_weights(scores, groups, temperature=2.0)
    g0 = np.exp(np.array([3.0, 0.5]) / 2)
    g1 = np.exp(np.array([1.0, 2.0]) / 2)
    assert w.tolist() == pytest.approx([2 * g0[0] / g0.sum(), 2 * g1[0] / g1.sum(), 2 * g0[1] / g0.sum(),
                                        2 * g1[1] / g1.sum(), 1.0], rel=1e-6)


def test_hargo_estimator_against_numpy():
    rewards = np.array([1.0, 0.0, 1.0, 0.0, 0.0])
    groups = [0, 0, 0, 1, 1]
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    ref = torch.tensor([[-0.1, -0.3, -0.2], [-2.0, -1.0, -9.0], [-0.05, -9.0, -9.0], [-1.0, -1.0, -1.0],
                        [-0.5, -0.5, -0.5]])
    out = adv("hargo", rewards.tolist(), groups, width=3, mask=mask, ref_logp=ref, lam=2.0, temperature=0.5)
    r = rewards[:3]
    a = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    c = np.exp([-0.2, -1.5, -0.05])
    mod = a * (1 + 2.0 * r.std(ddof=1) * (1 - c))
    e = np.exp(np.abs(mod) / 0.5)
    expected = np.concatenate([3 * e / e.sum() * mod, [0.0, 0.0]])  # group 1: equal rewards, A = 0
    assert out[:, 0].tolist() == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-6)
    assert torch.equal(out, out[:, :1] * mask)
    assert sequence_confidence(ref, mask)[:3].tolist() == pytest.approx(c.tolist(), rel=1e-6)


def test_hargo_singleton_group_has_no_contrast_boost():
    ref = torch.full((1, 2), -3.0)
    out = adv("hargo", [1.0], [0], ref_logp=ref)
    assert out[0, 0].item() == pytest.approx(1.0, rel=1e-5)  # GRPO singleton: A = r, D = 0, w = 1


def test_hargo_missing_reference_is_named():
    assert ADVANTAGES.get("hargo").requires == {"ref_logp"}
    with pytest.raises(ValueError, match="ref_logp"):
        adv("hargo", [1, 0], [0, 0])


def test_gft_is_marked_row_local():
    assert LOSSES.get("gft").zero_at_zero_advantage
    assert not getattr(LOSSES.get("policy_split"), "zero_at_zero_advantage", False)
