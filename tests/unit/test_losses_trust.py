"""HTPO, rollout corrections (TIS, MIS, TRM), CISPO and SAPO against specs/algorithms.md §1 and §10
and against values computed by hand or with numpy, independently of the implementation."""
import math

import numpy as np
import pytest
import torch

import lmrl.algos.losses_trust  # noqa: F401  (registers the losses)
from lmrl.algos.losses import LOSSES, LossInputs
from lmrl.algos.losses_trust import trm_keep_mask

NAMES = [
    "htpo", "ppo_clip_tis", "ppo_clip_mis_token", "ppo_clip_mis_seq", "ppo_clip_tis_seq", "trust_region_masking",
    "cispo", "sapo",
]
SPEC_ENTROPY = [0.1, 0.5, 2.0, 0.3, 1.5]  # spec §1: only token 3 (index 2) is high-entropy


def inputs(log_ratio, adv, mask=None, entropy=None, rollout_log_ratio=None, **extras):
    """ρ = exp(log_ratio) with logp = 0 as the gradient leaf; rollout_log_ratio = old − rollout."""
    lr = torch.tensor(log_ratio, dtype=torch.float)
    logp = torch.zeros_like(lr, requires_grad=True)
    old = -lr
    a = torch.tensor(adv, dtype=torch.float)
    a = a.expand_as(lr) if a.dim() == 0 else (a.unsqueeze(1).expand_as(lr) if a.dim() == 1 else a)
    ex = {k: torch.tensor(v, dtype=torch.float) for k, v in extras.items()}
    if rollout_log_ratio is not None:
        ex["rollout_logp"] = old - torch.tensor(rollout_log_ratio, dtype=torch.float)
    m = torch.ones_like(lr) if mask is None else torch.tensor(mask, dtype=torch.float)
    ent = None if entropy is None else torch.tensor(entropy, dtype=torch.float)
    return logp, LossInputs(logp=logp, old_logp=old, advantages=a.clone(), mask=m, entropy=ent, extras=ex)


def htpo_inputs(rho, adv, acc, group_acc):
    """One sequence with the spec's entropies [0.1, 0.5, 2.0, 0.3, 1.5]."""
    return inputs(logs([rho]), [adv], entropy=[SPEC_ENTROPY], acc=[acc], group_acc=[group_acc])


def logs(values):
    return [[math.log(v) for v in row] for row in values]


def run(name, x, logp, **knobs):
    loss, metrics = LOSSES.get(name)(x, **knobs)
    loss.sum().backward()
    return loss.detach(), logp.grad, metrics


# --- HTPO (spec §1) -------------------------------------------------------------------------------


def test_htpo_spec_correct_hard_case():
    logp, x = htpo_inputs([1.0, 1.1, 1.5, 1.3, 0.7], 1.0, acc=1.0, group_acc=0.25)
    loss, grad, m = run("htpo", x, logp)
    assert loss[0].tolist() == pytest.approx([-1.0, -1.1, 1.28, -1.28, -0.7], abs=1e-5)
    assert loss.mean().item() == pytest.approx(-0.56, abs=1e-5)
    assert grad[0].tolist() == pytest.approx([-1.0, -1.1, 1.28, 0.0, -0.7], abs=1e-5)
    assert m["htpo/high_entropy_frac"] == pytest.approx(0.2)
    assert m["htpo/hard_frac"] == 1.0


@pytest.mark.parametrize("group_acc", [0.25, 0.75])  # hard ∧ wrong and easy ∧ wrong share the rule
def test_htpo_spec_wrong_case(group_acc):
    logp, x = htpo_inputs([1.0, 0.9, 0.7, 1.3, 0.75], -1.0, acc=0.0, group_acc=group_acc)
    loss, grad, _ = run("htpo", x, logp)
    assert loss[0].tolist() == pytest.approx([1.0, 0.9, -0.8, 1.3, 0.8], abs=1e-5)
    assert loss.mean().item() == pytest.approx(0.64, abs=1e-5)
    # token 3: d/dlogp (0.8·A·r_id) = −0.8, so descent raises its probability; token 5 is clipped
    assert grad[0].tolist() == pytest.approx([1.0, 0.9, -0.8, 1.3, 0.0], abs=1e-5)


def test_htpo_hard_correct_low_ratio_branch_has_the_flagged_positive_sign():
    logp, x = htpo_inputs([1.0, 1.0, 0.5, 1.0, 1.0], 1.0, acc=1.0, group_acc=0.0)
    loss, grad, _ = run("htpo", x, logp)
    assert loss[0, 2].item() == pytest.approx(2.0)  # +sg[1/ρ]·A·r_id = 1/0.5
    assert grad[0, 2].item() == pytest.approx(2.0)  # positive: descent lowers a correct token's p


def test_htpo_easy_correct_clips_high_tokens_and_zeroes_the_top_q2():
    ent = [[0.1, 0.2, 0.3, 3.0, 0.4, 0.5, 0.6, 2.5, 0.7, 0.8]]  # n=10 → k=2: tokens 3 and 7 are high
    rho = [[1.0, 1.0, 1.0, 1.5, 1.0, 1.0, 1.0, 1.5, 1.0, 1.0]]
    logp, x = inputs(logs(rho), [1.0], entropy=ent, acc=[1.0], group_acc=[0.75])
    loss, grad, m = run("htpo", x, logp)
    expected = [-1.0] * 10
    expected[3], expected[7] = 0.0, -1.28  # top-1 high token zeroed (k' = max(⌊0.02·2⌋, 1)); other clipped
    assert loss[0].tolist() == pytest.approx(expected, abs=1e-5)
    grad_expected = [-1.0] * 10
    grad_expected[3] = grad_expected[7] = 0.0
    assert grad[0].tolist() == pytest.approx(grad_expected, abs=1e-5)
    assert m["htpo/zeroed_frac"] == pytest.approx(0.1)


def test_htpo_difficulty_threshold_is_strict():
    # group accuracy exactly τ is easy: the single high token is then both clipped and zeroed (top q2)
    logp, x = htpo_inputs([1.0, 1.1, 1.5, 1.3, 0.7], 1.0, acc=1.0, group_acc=0.6)
    loss, _, m = run("htpo", x, logp)
    assert loss[0, 2].item() == 0.0
    assert m["htpo/hard_frac"] == 0.0


def test_htpo_low_side_clip_out_zeroes_k_minus_one_tokens():
    ent = [[0.9, 0.2, 0.7, 5.0, 0.3, 0.8, 0.4, 4.0, 0.6, 0.5]]  # high: 3, 7; low: 8 tokens
    logp, x = inputs([[0.0] * 10], [1.0], entropy=ent, acc=[1.0], group_acc=[0.0])
    loss, _, _ = run("htpo", x, logp, htpo_q1=0.25)  # k' = 2 → only the smallest (token 1) is zeroed
    assert [i for i, v in enumerate(loss[0].tolist()) if v == 0.0] == [1]
    logp, x = inputs([[0.0] * 10], [1.0], entropy=ent, acc=[1.0], group_acc=[0.0])
    loss, _, _ = run("htpo", x, logp)  # default q1 = 0.006 → k' = 1 → nothing zeroed (the code's off-by-one)
    assert (loss != 0).all()


def test_htpo_dual_clip_caps_every_negative_advantage_cell():
    rho = [1.0, 15.0, 20.0, 1.0, 1.0]  # token 2 (high, wrong, ρ not low) and token 1 (low) exceed c
    logp, x = htpo_inputs(rho, -1.0, acc=0.0, group_acc=0.25)
    loss, _, _ = run("htpo", x, logp)
    assert loss[0, 1:3].tolist() == pytest.approx([10.0, 10.0], abs=1e-4)
    logp, x = htpo_inputs(rho, -1.0, acc=0.0, group_acc=0.25)
    loss, _, _ = run("htpo", x, logp, dual_clip=None)
    assert loss[0, 1:3].tolist() == pytest.approx([15.0, 20.0], abs=1e-4)


def test_htpo_rows_are_independent_and_padding_is_ignored():
    rho = [[1.0, 1.1, 1.5, 1.3, 0.7, 3.0, 3.0], [1.0, 0.9, 0.7, 1.3, 0.75, 3.0, 3.0]]
    ent = [SPEC_ENTROPY + [100.0, 100.0]] * 2  # padding entropies would be "high" if counted
    mask = [[1.0] * 5 + [0.0, 0.0]] * 2
    logp, x = inputs(logs(rho), [1.0, -1.0], mask=mask, entropy=ent, acc=[1.0, 0.0], group_acc=[0.25, 0.25])
    loss, grad, m = run("htpo", x, logp)
    assert loss[0, :5].tolist() == pytest.approx([-1.0, -1.1, 1.28, -1.28, -0.7], abs=1e-5)
    assert loss[1, :5].tolist() == pytest.approx([1.0, 0.9, -0.8, 1.3, 0.8], abs=1e-5)
    assert grad[1, :5].tolist() == pytest.approx([1.0, 0.9, -0.8, 1.3, 0.0], abs=1e-5)
    assert m["htpo/high_entropy_frac"] == pytest.approx(0.2)


# --- Truncated and masked importance sampling -----------------------------------------------------


def test_tis_weights_the_clipped_loss_by_the_truncated_rollout_ratio():
    rollout = np.log([[0.5, 1.5, 3.0]])
    logp, x = inputs(logs([[1.0, 1.0, 1.5]]), [1.0], rollout_log_ratio=rollout.tolist())
    loss, grad, m = run("ppo_clip_tis", x, logp, eps_high=0.28, tis_cap=2.0)
    w = np.minimum(np.exp(rollout[0]), 2.0)
    assert loss[0].tolist() == pytest.approx((-w * [1.0, 1.0, 1.28]).tolist(), abs=1e-5)
    assert grad[0].tolist() == pytest.approx((-w * [1.0, 1.0, 0.0]).tolist(), abs=1e-5)
    assert m["is_weight_mean"] == pytest.approx(w.mean(), abs=1e-6)
    assert m["is_truncated_frac"] == pytest.approx(1 / 3)


def test_mis_token_masks_tokens_outside_the_band_and_keeps_the_weight_inside():
    rollout = np.log([[0.4, 1.0, 3.0, 6.0]])
    logp, x = inputs([[0.0] * 4], [2.0], rollout_log_ratio=rollout.tolist())
    loss, grad, m = run("ppo_clip_mis_token", x, logp, mis_token_low=0.5, mis_token_high=5.0)
    assert loss[0].tolist() == pytest.approx([0.0, -2.0, -6.0, 0.0], abs=1e-5)
    assert grad[0].tolist() == pytest.approx([0.0, -2.0, -6.0, 0.0], abs=1e-5)
    assert m["masked_frac"] == pytest.approx(0.5)
    assert m["is_weight_mean"] == pytest.approx(1.0)


SEQ_ROLLOUT = [[0.2, 0.3, 0.0], [0.5, 0.5, 0.0], [0.1, -0.1, 9.0]]  # 9.0 sits on a padding position
SEQ_MASK = [[1.0, 1.0, 0.0]] * 3


@pytest.mark.parametrize("agg, lo, hi", [("sum", 0.5, 2.0), ("mean", 0.8, 1.25)])
def test_mis_seq_rejects_whole_sequences(agg, lo, hi):
    lr = np.array(SEQ_ROLLOUT) * np.array(SEQ_MASK)
    stat = lr.sum(1) if agg == "sum" else lr.sum(1) / 2
    keep = (stat >= math.log(lo)) & (stat <= math.log(hi))
    w = (np.exp(stat) if agg == "sum" else np.ones(3)) * keep
    assert keep.tolist() == ([True, False, True] if agg == "sum" else [False, False, True])
    logp, x = inputs([[0.0] * 3] * 3, [1.0, 1.0, 1.0], mask=SEQ_MASK, rollout_log_ratio=SEQ_ROLLOUT)
    loss, grad, m = run("ppo_clip_mis_seq", x, logp, mis_seq_low=lo, mis_seq_high=hi, mis_seq_agg=agg)
    expected = np.repeat(-w[:, None], 2, 1)
    assert np.allclose(loss[:, :2].numpy(), expected, atol=1e-5)
    assert np.allclose(grad[:, :2].numpy(), expected, atol=1e-5)
    assert m["seq_masked_frac"] == pytest.approx(1 - keep.mean())
    assert m["masked_frac"] == pytest.approx(1 - keep.mean())


def test_mis_seq_rejects_an_unknown_aggregation():
    _, x = inputs([[0.0]], [1.0], rollout_log_ratio=[[0.0]])
    with pytest.raises(ValueError, match="mis_seq_agg"):
        LOSSES.get("ppo_clip_mis_seq")(x, mis_seq_agg="max")


def test_tis_seq_truncates_the_sequence_ratio():
    """Rows of SEQ_ROLLOUT: Σ log-ratio 0.5 (kept, w = e^0.5), 1.0 (e^1 > 2: truncated to 2), 0.0 (w = 1;
    the 9.0 is padding)."""
    logp, x = inputs([[0.0] * 3] * 3, [1.0, -1.0, 1.0], mask=SEQ_MASK, rollout_log_ratio=SEQ_ROLLOUT)
    loss, grad, m = run("ppo_clip_tis_seq", x, logp, tis_seq_cap=2.0)
    w = [math.exp(0.5), 2.0, 1.0]
    expected = np.array([[-w[0]] * 2, [w[1]] * 2, [-w[2]] * 2])
    assert np.allclose(loss[:, :2].numpy(), expected, atol=1e-5)
    assert np.allclose(grad[:, :2].numpy(), expected, atol=1e-5)
    assert m["seq_truncated_frac"] == pytest.approx(1 / 3)
    assert m["is_weight_mean"] == pytest.approx(sum(w) / 3, abs=1e-5)


# --- Trust Region Masking (spec §10) --------------------------------------------------------------

TRM_ROWS = [[0.0, 0.1, -0.05], [0.0, 0.5, 0.0]]


def test_trm_spec_case_k3_max():
    lr = np.array(TRM_ROWS)
    k3 = np.exp(lr) - 1 - lr
    assert k3[0].tolist() == pytest.approx([0.0, 0.00517, 0.00123], abs=1e-5)
    assert k3[1].max() == pytest.approx(0.1487, abs=1e-4)
    logp, x = inputs(logs([[1.1, 0.9, 1.0]] * 2), [1.0], rollout_log_ratio=TRM_ROWS)
    loss, grad, m = run("trust_region_masking", x, logp, trm_criteria="seq_max_k3", trm_threshold=0.01)
    assert loss[0].tolist() == pytest.approx([-1.1, -0.9, -1.0], abs=1e-5)  # kept: plain ppo_clip
    assert grad[0].tolist() == pytest.approx([-1.1, -0.9, -1.0], abs=1e-5)
    assert loss[1].tolist() == [0.0, 0.0, 0.0] and grad[1].tolist() == [0.0, 0.0, 0.0]
    assert m["masked_frac"] == pytest.approx(0.5)
    assert m["seq_masked_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("delta, kept", [(0.124, False), (0.126, True)])
def test_trm_default_is_seq_max_k2(delta, kept):  # spec: k2 max of the second row = 0.125
    logp, x = inputs([[0.0] * 3] * 2, [1.0], rollout_log_ratio=TRM_ROWS)
    loss, _, _ = run("trust_region_masking", x, logp, trm_threshold=delta)
    assert bool((loss[1] != 0).all()) is kept
    assert (loss[0] != 0).all()


def test_trm_chained_criteria_are_anded():
    lr, mask = torch.tensor(TRM_ROWS), torch.ones(2, 3)
    assert trm_keep_mask(lr, mask, "token_k1", 1.2).tolist() == [[True] * 3, [True, False, True]]  # e^.5>1.2
    logp, x = inputs([[0.0] * 3] * 2, [1.0], rollout_log_ratio=TRM_ROWS)
    loss, _, m = run("trust_region_masking", x, logp, trm_criteria="seq_max_k3, token_k1",
                     trm_threshold=[1.0, 1.2])
    assert (loss == 0).tolist() == [[False] * 3, [False, True, False]]
    assert m["masked_frac"] == pytest.approx(1 / 6)
    assert m["seq_masked_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("criterion, threshold, keep_row0", [
    ("seq_sum_k2", 0.006, False), ("seq_sum_k2", 0.007, True),  # ½(0.1² + 0.05²) = 0.00625
    ("seq_mean_k2", 0.002, False), ("seq_mean_k2", 0.0021, True),  # 0.00625 / 3 = 0.002083
    ("token_k3", 0.005, False), ("token_k3", 0.0052, True),  # max token k3 = 0.005171
])
def test_trm_sum_mean_and_token_statistics(criterion, threshold, keep_row0):
    keep = trm_keep_mask(torch.tensor(TRM_ROWS), torch.ones(2, 3), criterion, threshold)
    assert bool(keep[0].all()) is keep_row0


@pytest.mark.parametrize("u, kept", [(1.6, False), (1.7, True)])  # row 1: Σ lr = 0.5, ratio e^.5 = 1.6487
def test_trm_k1_uses_symmetric_ratio_bounds(u, kept):
    keep = trm_keep_mask(torch.tensor(TRM_ROWS), torch.ones(2, 3), "seq_sum_k1", u)
    assert bool(keep[1].all()) is kept
    flipped = trm_keep_mask(-torch.tensor(TRM_ROWS), torch.ones(2, 3), "seq_sum_k1", u)
    assert bool(flipped[1].all()) is kept


def test_trm_ignores_padding():
    keep = trm_keep_mask(torch.tensor([[0.0, 5.0]]), torch.tensor([[1.0, 0.0]]), "seq_max_k3", 0.01)
    assert keep.tolist() == [[True, True]]


@pytest.mark.parametrize("criteria, threshold", [
    ("seq_max_k1", 2.0), ("seq_median_k2", 2.0), ("seq_max", 2.0), ("seq_max_k2,token_k1", [2.0]), ("", 2.0),
])
def test_trm_rejects_bad_criteria(criteria, threshold):
    _, x = inputs([[0.0]], [1.0], rollout_log_ratio=[[0.0]])
    with pytest.raises(ValueError):
        LOSSES.get("trust_region_masking")(x, trm_criteria=criteria, trm_threshold=threshold)


# --- CISPO ------------------------------------------------------------------------------------------


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


# --- SAPO -------------------------------------------------------------------------------------------


def test_sapo_gradient_at_ratio_one_is_minus_advantage():
    logp, x = inputs([[0.0, 0.0]], [[2.0, -3.0]])
    loss, grad, m = run("sapo", x, logp)
    assert grad[0].tolist() == pytest.approx([-2.0, 3.0], abs=1e-6)
    assert loss[0].tolist() == pytest.approx([-2.0 * 2 / 1.0, 3.0 * 2 / 1.05], abs=1e-5)  # −A·(4/τ)·½
    assert m["sapo/gate_slope_mean"] == pytest.approx(1.0)


def test_sapo_hand_values_away_from_one():
    rho, adv = np.array([1.5, 0.5, 3.0]), np.array([1.0, -1.0, -2.0])
    tau = np.where(adv > 0, 0.5, 2.0)
    sig = 1 / (1 + np.exp(-tau * (rho - 1)))
    logp, x = inputs(logs([rho.tolist()]), [adv.tolist()])
    loss, grad, _ = run("sapo", x, logp, sapo_tau_pos=0.5, sapo_tau_neg=2.0)
    assert loss[0].tolist() == pytest.approx((-adv * 4 / tau * sig).tolist(), abs=1e-5)
    assert grad[0].tolist() == pytest.approx((-adv * 4 * sig * (1 - sig) * rho).tolist(), abs=1e-5)


# --- Contract ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_contract_with_the_algorithm_knobs(name):
    torch.manual_seed(0)
    b, t = 4, 6
    logp = (torch.randn(b, t) * 0.1 - 1.0).requires_grad_()
    mask = torch.ones(b, t)
    mask[1, 4:] = 0
    extras = {"acc": torch.tensor([1.0, 0.0, 1.0, 0.0]), "group_acc": torch.tensor([0.5, 0.5, 0.75, 0.75]),
              "rollout_logp": logp.detach() + 0.05 * torch.randn(b, t)}
    x = LossInputs(logp=logp, old_logp=logp.detach() + 0.05 * torch.randn(b, t),
                   advantages=torch.randn(b, 1).expand(b, t), mask=mask, entropy=torch.rand(b, t),
                   extras=extras)
    loss, metrics = LOSSES.get(name)(x, eps_low=0.2, eps_high=0.28, dual_clip=None)
    assert loss.shape == (b, t) and torch.isfinite(loss).all()
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    (loss * mask).sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert name in LOSSES and LOSSES.describe(name)
