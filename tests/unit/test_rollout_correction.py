"""TIS, MIS and Trust Region Masking against docs/methods/{rollout_correction,trust_region_masking}.md
and values computed by hand, independently of the implementation."""
import math

import numpy as np
import pytest
import torch

from algo_helpers import logs
from algo_helpers import run_loss as run
from algo_helpers import token_inputs as inputs
from lmrl.algos.losses import LOSSES
from lmrl.algos.rollout_correction import trm_keep_mask


SEQ_ROLLOUT = [[0.2, 0.3, 0.0], [0.5, 0.5, 0.0], [0.1, -0.1, 9.0]]  # 9.0 sits on a padding position
SEQ_MASK = [[1.0, 1.0, 0.0]] * 3
TRM_ROWS = [[0.0, 0.1, -0.05], [0.0, 0.5, 0.0]]


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
def test_trm_default_is_seq_max_k2(delta, kept):  # docs/methods/trust_region_masking.md: k2 max of row 2 = 0.125
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
