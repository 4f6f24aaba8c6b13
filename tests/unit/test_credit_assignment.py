"""EqLen, P-GRPO, HARGO and ResRL against the checks of docs/methods/{eqlen,p_grpo,hargo,resrl}.md and
against values computed by hand or with numpy, independently of the implementation."""
import math

import numpy as np
import pytest
import torch

from algo_helpers import adv
from algo_helpers import run_estimator as run
from lmrl.algos import ADVANTAGES
from lmrl.algos.credit_assignment import (
    default_pairs,
    distance_weights,
    eqlen_mask,
    group_softmax_weights,
    hargo_modulate,
    length_penalty_factor,
    pmi_token_weights,
    projection_distances,
    sequence_confidence,
    svd_token_weights,
)


def t(x):
    return torch.tensor(x, dtype=torch.float)


def test_eqlen_mask_spec_value():
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert eqlen_mask(mask, torch.tensor([0, 0])).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]


def test_eqlen_pairs_and_offsets():
    assert default_pairs(torch.tensor([0, 0, 0, 0, 1, 1, 0])).tolist() == [0, 0, 1, 1, 3, 3, 2]
    mask = torch.tensor([[0.0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    cut = eqlen_mask(mask, torch.tensor([0, 0, 1]))  # first 3 valid tokens, wherever they start
    assert cut.tolist() == [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0]]


def test_eqlen_advantage_zeroes_the_longer_tail():
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    adv = run("eqlen", [1, 0, 0, 1], mask=mask)
    base = run("grpo", [1, 0, 0, 1], mask=mask)
    assert adv[:, :2].tolist() == base[:, :2].tolist()
    assert adv[1, 3:].abs().sum() == 0 and adv[3, 2:].abs().sum() == 0 and adv[1, 2] != 0
    assert run("eqlen", [1, 0, 0, 1], mask=mask, base="dr_grpo")[0, 0].item() == pytest.approx(0.5)
    with pytest.raises(ValueError):
        run("eqlen", [1, 0], base="eqlen")


def test_pmi_weights_spec_value():
    w = pmi_token_weights(torch.tensor([[0.0, math.log(3), 7.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert w.tolist()[0] == pytest.approx([0.5, 1.5, 0.0])
    assert pmi_token_weights(torch.zeros(1, 2), torch.zeros(1, 2)).tolist() == [[0.0, 0.0]]


def test_p_grpo_spec_values():
    pmi = torch.tensor([[0.0, math.log(3)], [0.0, 0.0]])
    full = run("p_grpo", [4, 0], width=2, pmi=pmi, base="dr_grpo")  # A = [2, −2]
    assert full[0].tolist() == pytest.approx([1.0, 3.0])
    off = run("p_grpo", [4, 0], width=2, pmi=pmi, base="dr_grpo", step=0, ramp_steps=10)
    assert off[0].tolist() == pytest.approx([2.0, 2.0])
    half = run("p_grpo", [4, 0], width=2, pmi=pmi, base="dr_grpo", step=5, ramp_steps=10)
    assert half[0].tolist() == pytest.approx([1.5, 2.5])
    assert full[1].tolist() == pytest.approx([-2.0, -2.0])


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
    assert ADVANTAGES.spec("hargo").requires == {"ref_logp"}
    with pytest.raises(ValueError, match="ref_logp"):
        adv("hargo", [1, 0], [0, 0])


def test_resrl_spec_distance_weights_and_flat_case():
    w = distance_weights(t([0, 0.1, 0.2, 0.3, 0.4]))
    assert w.tolist() == pytest.approx([0.1, 0.175, 0.55, 0.925, 1.0])
    assert distance_weights(t([0.3, 0.3, 0.3])).tolist() == pytest.approx([0.55] * 3)


def test_resrl_spec_length_penalty():
    f = length_penalty_factor(t([3798, 3500, 100, 4096, 9000]))
    assert f.tolist() == pytest.approx([0.85, 1.0, 1.0, 0.7, 0.7])


def test_resrl_spec_negative_token_in_the_positive_span_gets_distance_zero():
    g = torch.Generator().manual_seed(0)
    positives = torch.randn(6, 16, generator=g)
    negatives = torch.stack([positives[2], torch.randn(16, generator=g)])
    d = projection_distances(positives, negatives)
    assert d[0] == pytest.approx(0.0, abs=1e-5)
    assert d[1] > 0.05
    assert projection_distances(positives[:3], negatives) is None  # under 4 positive tokens


def test_resrl_estimator_scales_positives_and_weights_negatives_in_mixed_groups_only():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(8, 5, 12, generator=g)
    mask = torch.ones(8, 5)
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    rewards = torch.zeros(8, 5)
    rewards[:, -1] = t([1, 1, 0, 0, 1, 1, 1, 0.5])  # group 1 has only positive scores
    grpo = ADVANTAGES.get("grpo")(rewards, group, mask)
    out = ADVANTAGES.get("resrl")(rewards, group, mask, hidden=hidden)
    assert torch.allclose(out[:2], 0.1 * grpo[:2])
    ratio = out[2:4] / grpo[2:4]
    assert ((ratio >= 0.1 - 1e-6) & (ratio <= 1 + 1e-6)).all() and ratio.min() == pytest.approx(0.1)
    assert torch.allclose(out[4:], grpo[4:])
    weights = svd_token_weights(hidden, mask, rewards.sum(1) > 0, group)
    assert torch.allclose(out[2:4], grpo[2:4] * weights[2:4])
    assert ADVANTAGES.spec("resrl").hidden_layer == -2
