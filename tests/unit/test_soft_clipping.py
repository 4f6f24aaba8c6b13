"""CISPO, SAPO, GFT and Output Reset against docs/methods/{cispo,sapo,gft,output_reset}.md and values
computed by hand or with numpy, independently of the implementation."""
import math

import numpy as np
import pytest
import torch

from algo_helpers import adv, logs, loss_inputs, rollout_inputs, token_inputs
from algo_helpers import run_loss as run
from lmrl.algos import LOSSES, LossInputs
from lmrl.algos.soft_clipping import gft_batch_tau


def cispo_inputs():
    logp = torch.tensor([[-0.5, -1.0, -2.0, -0.3]], requires_grad=True)
    lr = torch.tensor([logs([[1.5, 1.0, 0.5, 0.1]])[0]])
    x = LossInputs(logp=logp, old_logp=logp.detach() - lr, advantages=torch.tensor([[1.0, 1.0, -1.0, -1.0]]),
                   mask=torch.ones(1, 4))
    return logp, x


def test_cispo_clips_the_weight_but_every_token_keeps_a_gradient():
    logp, x = cispo_inputs()
    loss, grad, m = run("cispo", x, logp)  # defaults: ε_hi = 0.28, no lower clip
    w, a = np.array([1.28, 1.0, 0.5, 0.1]), np.array([1.0, 1.0, -1.0, -1.0])
    lp = np.array([-0.5, -1.0, -2.0, -0.3])
    assert loss[0].tolist() == pytest.approx((-w * a * lp).tolist(), abs=1e-5)  # [0.64, 1, -1, -0.03]
    assert grad[0].tolist() == pytest.approx((-w * a).tolist(), abs=1e-5)  # token 0 keeps −1.28 (ppo_clip: 0)
    assert m["clip_frac"] == pytest.approx(0.25)


def test_cispo_lower_clip_when_eps_low_is_below_one():
    logp, x = cispo_inputs()
    _, grad, m = run("cispo", x, logp, eps_low=0.2, eps_high=0.28)
    assert grad[0].tolist() == pytest.approx([-1.28, -1.0, 0.8, 0.8], abs=1e-5)
    assert m["clip_frac"] == pytest.approx(0.75)


def test_sapo_gradient_at_ratio_one_is_minus_advantage():
    logp, x = token_inputs([[0.0, 0.0]], [[2.0, -3.0]])
    loss, grad, m = run("sapo", x, logp)
    assert grad[0].tolist() == pytest.approx([-2.0, 3.0], abs=1e-6)
    assert loss[0].tolist() == pytest.approx([-2.0 * 2 / 1.0, 3.0 * 2 / 1.05], abs=1e-5)  # −A·(4/τ)·½
    assert m["sapo/gate_slope_mean"] == pytest.approx(1.0)


def test_sapo_hand_values_away_from_one():
    rho, adv = np.array([1.5, 0.5, 3.0]), np.array([1.0, -1.0, -2.0])
    tau = np.where(adv > 0, 0.5, 2.0)
    sig = 1 / (1 + np.exp(-tau * (rho - 1)))
    logp, x = token_inputs(logs([rho.tolist()]), [adv.tolist()])
    loss, grad, _ = run("sapo", x, logp, sapo_tau_pos=0.5, sapo_tau_neg=2.0)
    assert loss[0].tolist() == pytest.approx((-adv * 4 / tau * sig).tolist(), abs=1e-5)
    assert grad[0].tolist() == pytest.approx((-adv * 4 * sig * (1 - sig) * rho).tolist(), abs=1e-5)


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
    x.extras.update({k: torch.tensor(v) for k, v in
                     gft_batch_tau(x.old_logp, x.advantages, x.mask, gft_tau_quantile=0.5).items()})
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
        gft_batch_tau(x.old_logp, x.advantages, x.mask, gft_tau_quantile=1.5)
    with pytest.raises(ValueError, match="whole batch's quantile"):  # τ is never a micro-batch's own
        LOSSES.get("gft")(x, gft_tau_quantile=0.5)


def test_gft_declares_its_quantile_a_whole_batch_statistic():
    spec = LOSSES.spec("gft")
    assert spec.reads_whole_batch({"gft_tau_quantile": 0.5})
    assert not spec.reads_whole_batch({"gft_tau": 0.1})
    assert not LOSSES.spec("cispo").reads_whole_batch({})


def test_gft_is_marked_row_local():
    assert LOSSES.spec("gft").zero_at_zero_advantage
    assert not LOSSES.spec("policy_split").zero_at_zero_advantage


@pytest.mark.parametrize("adv, shift, loss, grad", [
    (1.0, 0.0, 0.04, -0.4),     # e = 0.2
    (1.0, 0.25, 0.0, 0.0),      # crossed the margin: reset, no gradient
    (-1.0, 0.05, 0.0625, 0.5),  # e = 0.25
    (2.0, 0.0, 0.08, -0.8),     # |A| scales the loss
    (0.0, 0.1, 0.0, 0.0),
])
def test_output_reset_spec_cases(adv, shift, loss, grad):
    logp, x = rollout_inputs([[0.0]], [adv], rollout_shift=[[shift]])
    value, g, _ = run("output_reset", x, logp, or_margin=0.2)
    assert value.item() == pytest.approx(loss, abs=1e-6)
    assert g.item() == pytest.approx(grad, abs=1e-6)


def test_output_reset_gradient_decays_linearly_to_the_margin():
    shifts = [[0.0, 0.05, 0.1, 0.15, 0.2, 0.3]]
    logp, x = rollout_inputs([[0.0] * 6], [1.0], rollout_shift=shifts)
    _, g, m = run("output_reset", x, logp)
    assert g[0].tolist() == pytest.approx([-0.4, -0.3, -0.2, -0.1, 0.0, 0.0], abs=1e-6)
    assert m["or/active_frac"] == pytest.approx(4 / 6)


def test_output_reset_measures_against_old_logp_on_request():
    logp, x = rollout_inputs([[0.1]], [1.0], rollout_shift=[[0.5]])  # logp − old = 0.1, logp − rollout = 0.5
    value, _, _ = run("output_reset", x, logp, or_reference="old")
    assert value.item() == pytest.approx(0.1 ** 2, abs=1e-6)
    logp, x = rollout_inputs([[0.1]], [1.0], rollout_shift=[[0.5]])
    assert run("output_reset", x, logp)[0].item() == 0.0


def test_output_reset_bad_knobs_and_missing_rollout_are_named():
    logp, x = rollout_inputs([[0.0]], [1.0])
    with pytest.raises(ValueError, match="or_margin"):
        LOSSES.get("output_reset")(x, or_margin=0.0)
    with pytest.raises(ValueError, match="or_reference"):
        LOSSES.get("output_reset")(x, or_reference="ref")
    del x.extras["rollout_logp"]
    with pytest.raises(ValueError, match="rollout_logp"):
        LOSSES.get("output_reset")(x)
