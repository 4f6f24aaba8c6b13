"""ACRL and PIPO against docs/methods/{acrl,pipo}.md and values computed by hand or with numpy."""
import math

import numpy as np
import pytest
import torch

from algo_helpers import rollout_inputs as inputs
from algo_helpers import run_loss as run
from lmrl.algos import ADVANTAGES, LOSSES
from lmrl.algos.advantages import outcome_to_token_rewards
from lmrl.algos.controllers import (
    AcrlController,
    PolicyImprovementMonitor,
    acrl_discrepancy,
    acrl_next_band,
    pipo_verdict,
)
from lmrl.loading import build_config
from lmrl.validation import check_names


def test_acrl_spec_band_shrinks_and_masks_the_token():
    assert acrl_next_band(2.0, 0.02, d_high=0.01, kappa=1.25) == pytest.approx(1.6)
    rho = 1.8  # π_train/π_rollout of one token
    logp, x = inputs([[0.0, 0.0]], [1.0], rollout_shift=[[0.0, math.log(rho)]])
    kept, g_kept, _ = run("acrl", x, logp, acrl_band=2.0)
    assert kept[0].tolist() == pytest.approx([-1.0, -1.0])
    logp, x = inputs([[0.0, 0.0]], [1.0], rollout_shift=[[0.0, math.log(rho)]])
    masked, g, m = run("acrl", x, logp, acrl_band=1.6)
    assert masked[0].tolist() == pytest.approx([-1.0, 0.0])
    assert g[0].tolist() == pytest.approx([-1.0, 0.0])
    assert m["masked_frac"] == pytest.approx(0.5)
    assert m["acrl/band"] == pytest.approx(1.6)


def test_acrl_band_from_extras_overrides_the_knob_per_row():
    shift = [[math.log(1.8)], [math.log(1.8)]]
    logp, x = inputs([[0.0], [0.0]], [1.0, 1.0], rollout_shift=shift, acrl_band=[2.0, 1.6])
    loss, _, _ = run("acrl", x, logp, acrl_band=5.0)
    assert loss[:, 0].tolist() == pytest.approx([-1.0, 0.0])
    logp, x = inputs([[0.0]], [1.0], rollout_shift=[[math.log(0.55)]])  # ρ = 0.55 ≥ 1/c = 0.5: kept
    assert run("acrl", x, logp)[0].item() == pytest.approx(-1.0)
    logp, x = inputs([[0.0]], [1.0], rollout_shift=[[math.log(0.45)]])  # below 1/2: masked
    assert run("acrl", x, logp)[0].item() == 0.0


def test_acrl_controller_widens_holds_and_stays_in_bounds():
    assert acrl_next_band(2.0, 1e-4) == pytest.approx(2.5)  # D < d_low = 1e-3
    assert acrl_next_band(2.0, 5e-3) == 2.0  # inside [d_low, d_high]
    assert acrl_next_band(1.2, 1.0) == pytest.approx(1.1)  # 1.2/1.25 = 0.96 → band_min
    assert acrl_next_band(9.0, 0.0) == pytest.approx(10.0)
    ctl = AcrlController()
    assert [ctl.update(d) for d in (0.02, 0.02, 0.005, 0.0)] == pytest.approx([1.6, 1.28, 1.28, 1.6])
    fresh = AcrlController()
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.update(0.02) == ctl.update(0.02)
    with pytest.raises(ValueError, match="kappa"):
        acrl_next_band(2.0, 0.1, kappa=1.0)


def test_acrl_discrepancy_is_the_mean_k3():
    train = torch.tensor([[0.1, -0.2, 5.0]])
    roll = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    expected = ((math.exp(0.1) - 1 - 0.1) + (math.exp(-0.2) - 1 + 0.2)) / 2
    assert acrl_discrepancy(train, roll, mask) == pytest.approx(expected, rel=1e-5)
    logp, x = inputs([[-0.1, 0.2]], [1.0], rollout_shift=[[0.0, 0.0]])  # old_logp = [0.1, −0.2]
    assert run("acrl", x, logp)[2]["acrl/discrepancy"] == pytest.approx(expected, rel=1e-5)


def test_acrl_rejects_a_band_at_or_below_one():
    logp, x = inputs([[0.0]], [1.0])
    with pytest.raises(ValueError, match="acrl_band"):
        LOSSES.get("acrl")(x, acrl_band=1.0)


def test_pipo_spec_verdict_and_pi_reward():
    window = [0.40, 0.42, 0.44, 0.46]
    xi = pipo_verdict(window, 0.50)
    assert xi == pytest.approx(0.07 / np.std(window), rel=1e-4)
    assert xi == pytest.approx(3.13, abs=5e-3)
    mask = torch.ones(2, 3)
    tr = outcome_to_token_rewards(torch.tensor([1.0, 0.0]), mask)
    adv = ADVANTAGES.get("pipo")(tr, torch.tensor([0, 0]), mask, reward_window=window, current_reward_mean=0.5,
                                 base="dr_grpo")  # Â = [0.5, −0.5]
    assert adv[:, 0].tolist() == pytest.approx([1.565, -1.565], abs=1e-3)
    assert torch.equal(adv[:, 0:1].expand_as(adv), adv)


def test_pipo_rectifies_when_the_batch_got_worse():
    mask = torch.ones(4, 2)
    tr = outcome_to_token_rewards(torch.tensor([1.0, 0.0, 0.0, 1.0]), mask)
    adv = ADVANTAGES.get("pipo")(tr, torch.zeros(4, dtype=torch.long), mask, reward_window=[0.5, 0.7],
                                 current_reward_mean=0.4)
    xi = (0.4 - 0.6) / (0.1 + 1e-6)
    assert adv[:, 0].tolist() == pytest.approx([xi * 0.866025, -xi * 0.866025, -xi * 0.866025, xi * 0.866025],
                                               rel=1e-4)


def test_pipo_verdict_edge_cases():
    assert pipo_verdict([], 0.9) == 0.0
    assert pipo_verdict([0.5], 0.9) == 0.0
    assert pipo_verdict([0.5, 0.5], 0.6, verdict_clip=5.0) == 5.0
    assert pipo_verdict([0.5, 0.5], 0.4, verdict_clip=5.0) == -5.0


def test_policy_improvement_monitor_keeps_the_last_k_means():
    mon = PolicyImprovementMonitor(size=4)
    for mean in (0.38, 0.40, 0.42, 0.44, 0.46):
        mon.push(mean)
    assert mon.window == pytest.approx([0.40, 0.42, 0.44, 0.46])
    assert mon.verdict(0.50) == pytest.approx(pipo_verdict([0.40, 0.42, 0.44, 0.46], 0.50))
    copy = PolicyImprovementMonitor(size=4)
    copy.load_state_dict(mon.state_dict())
    assert copy.window == mon.window
    with pytest.raises(ValueError, match="window size"):
        PolicyImprovementMonitor(size=1)


def test_pipo_normal_step_is_the_base_and_a_half_given_verdict_input_is_named():
    mask = torch.ones(2, 1)
    rewards = torch.tensor([[1.0], [0.0]])
    normal = ADVANTAGES.get("pipo")(rewards, torch.tensor([0, 0]), mask)
    assert torch.equal(normal, ADVANTAGES.get("grpo")(rewards, torch.tensor([0, 0]), mask))
    with pytest.raises(ValueError, match="reward_window"):
        ADVANTAGES.get("pipo")(mask, torch.tensor([0, 0]), mask, current_reward_mean=0.5)
    check_names(build_config({"algo": {"advantage": "pipo", "advantage_params": {"pipo_window": 3}}}))


def test_control_losses_are_marked_row_local():
    assert LOSSES.spec("output_reset").zero_at_zero_advantage
    assert LOSSES.spec("acrl").zero_at_zero_advantage
