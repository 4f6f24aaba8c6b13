"""Extra advantage estimators and the Cost-Aware sampler against specs/algorithms.md §2, 4, 6, 7, 9, 18–20."""
import math

import pytest
import torch

from lmrl.algos.advantages import ADVANTAGES, outcome_to_token_rewards
from lmrl.algos.advantages_extra import (
    cost_aware_probs,
    cost_aware_weights,
    default_pairs,
    entropy_bounds,
    entrocraft_mode,
    eqlen_mask,
    modality_mask,
    pmi_token_weights,
    softmin_aggregate,
)

NEW = ["alpo", "entrocraft", "eqlen", "gdpo", "p_grpo", "prpo", "rvpo", "xgrpo"]


def run(name, rewards, groups=None, width=3, mask=None, **kw):
    r = torch.tensor(rewards, dtype=torch.float)
    mask = torch.ones(len(rewards), width) if mask is None else mask
    g = torch.tensor(groups or [0] * len(rewards))
    return ADVANTAGES.get(name)(outcome_to_token_rewards(r, mask), g, mask, **kw)


def seq(adv):
    assert torch.allclose(adv, adv[:, :1].expand_as(adv))
    return adv[:, 0].tolist()


def test_all_registered():
    assert set(NEW) <= set(ADVANTAGES.names())


@pytest.mark.parametrize("name", [n for n in NEW if n != "eqlen"])  # eqlen needs no extra input
def test_missing_required_input_is_named(name):
    with pytest.raises(ValueError, match="per-sample input"):
        run(name, [1, 0])


# §2 XGRPO

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


# §4 GDPO / RVPO

R1R2 = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])


def test_gdpo_spec_value_and_batch_norm():
    raw = seq(run("gdpo", [0] * 4, components=R1R2, batch_norm=False))
    assert raw == pytest.approx([1.732, 0, 0, -1.732], abs=1e-3)
    z = seq(run("gdpo", [0] * 4, components=R1R2))
    assert z == pytest.approx([1.2247, 0, 0, -1.2247], abs=1e-3)


def test_gdpo_weights_and_nan_components():
    w = seq(run("gdpo", [0] * 4, components=R1R2, component_weights=[1.0, 0.0], batch_norm=False))
    assert w == pytest.approx([0.866, 0.866, -0.866, -0.866], abs=1e-3)
    comps = R1R2.clone()
    comps[:, 1] = math.nan
    assert seq(run("gdpo", [0] * 4, components=comps, batch_norm=False)) == pytest.approx(w, abs=1e-6)


def test_rvpo_spec_value():
    adv = seq(run("rvpo", [0] * 4, components=R1R2, tau=1.0))
    assert adv == pytest.approx([0.866, -0.336, -0.336, -0.866], abs=1e-3)


def test_softmin_single_checks():
    assert softmin_aggregate(torch.tensor([1.0, -1.0]), 1.0).item() == pytest.approx(-0.4338, abs=1e-4)
    assert softmin_aggregate(torch.tensor([0.5, 0.5]), 1.0).item() == pytest.approx(0.5, abs=1e-6)
    a = torch.tensor([[1.0, -1.0, 0.5]])
    assert softmin_aggregate(a, 1e3).item() == pytest.approx(a.mean().item(), abs=1e-3)
    assert softmin_aggregate(a, 1e-3).item() == pytest.approx(-1.0, abs=1e-2)
    assert softmin_aggregate(torch.tensor([[math.nan, 0.3], [math.nan, math.nan]]), 1.0).tolist() == \
        pytest.approx([0.3, 0.0])


def test_rvpo_batch_norm_and_mask():
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 4)
    adv = run("rvpo", [0] * 4, components=R1R2, batch_norm=True, mask=mask)
    assert adv[:, 2].abs().max() == 0
    assert adv[:, 0].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv[:, 0].std().item() == pytest.approx(1.0, abs=1e-3)


# §7 Entrocraft

def test_entrocraft_bounds_at_half():
    assert entropy_bounds(50, 100) == pytest.approx((0.5, 0.6))
    assert entropy_bounds(0, 100, schedule="cosine") == pytest.approx((0.6, 0.7))
    assert entropy_bounds(25, 100, schedule="cosine")[0] == pytest.approx(0.6 - 0.2 * (1 - math.sqrt(0.5)) / 2)
    assert entropy_bounds(500, 100) == pytest.approx((0.4, 0.5))
    with pytest.raises(ValueError):
        entropy_bounds(0, 100, schedule="step")


@pytest.mark.parametrize("entropy,expected,mode", [
    (0.65, [1, 0, 1, 0], "raft++"),
    (0.45, [0, -1, 0, -1], "nsr"),
    (0.55, [0.866, -0.866, 0.866, -0.866], "grpo"),
])
def test_entrocraft_spec_values(entropy, expected, mode):
    assert entrocraft_mode(entropy, 50, 100) == mode
    adv = run("entrocraft", [1, -1, 1, -1], entropy=entropy, step=50, total_steps=100)
    assert seq(adv) == pytest.approx(expected, abs=1e-3)


def test_entrocraft_binary_rewards():
    adv = run("entrocraft", [1, 0, 1, 0], entropy=torch.tensor(0.45), step=50, total_steps=100,
              binary_to_signed=True)
    assert seq(adv) == pytest.approx([0, -1, 0, -1])


# §9 EqLen

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


# §18 P-GRPO

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


# §19 ALPO

def test_alpo_spec_value():
    speech = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    adv = run("alpo", [1, 0], acoustic_rewards=torch.tensor([0.0, 1.0]), speech_mask=speech)
    assert adv[0].tolist() == pytest.approx([0.707, 0.707, -0.707], abs=1e-3)
    assert adv[1].tolist() == pytest.approx([-0.707, 0.707, 0.707], abs=1e-3)
    explicit = run("alpo", [9, 9], acoustic_rewards=torch.tensor([0.0, 1.0]), speech_mask=speech,
                   text_rewards=torch.tensor([1.0, 0.0]))
    assert torch.allclose(explicit, adv)


def test_modality_mask_from_token_ranges():
    assert modality_mask(torch.tensor([[5, 100, 199, 200]]), (100, 200)).tolist() == [[0.0, 1.0, 1.0, 0.0]]


# §20 PRPO

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


# §6 Cost-Aware GRPO

A = torch.tensor([1.0, -1.0, 0.5, 0.0])
L = torch.tensor([100.0, 400.0, 100.0, 50.0])


def test_cost_aware_probs_spec_value():
    assert cost_aware_probs(A, L).tolist() == pytest.approx([0.5, 0.25, 0.25, 0.0])
    assert cost_aware_probs(torch.zeros(3), torch.ones(3)).tolist() == [0.0, 0.0, 0.0]


def test_cost_aware_weights_spec_value_and_zero_advantage_never_drawn():
    spec = [0.5, 1.0, 1.0]
    probs = cost_aware_probs(A, L)
    seen = set()
    for seed in range(50):
        sel, w = cost_aware_weights(A, L, 4, torch.Generator().manual_seed(seed))
        assert not sel[3] and w[3] == 0
        counts = w * 4 * probs
        assert counts.sum().item() == pytest.approx(4.0)
        assert torch.allclose(counts, counts.round(), atol=1e-5) and torch.equal(sel, counts.round() > 0)
        for i in range(3):
            if round(counts[i].item()) == 1:
                assert w[i].item() == pytest.approx(spec[i])
                seen.add(i)
    assert seen == {0, 1, 2}


def test_cost_aware_weights_are_unbiased():
    gen = torch.Generator().manual_seed(0)
    total = torch.zeros(4)
    for _ in range(4000):
        total += cost_aware_weights(A, L, 2, gen)[1]
    assert (total / 4000)[:3].tolist() == pytest.approx([1.0, 1.0, 1.0], abs=0.06)


def test_cost_aware_weights_all_zero_advantages():
    sel, w = cost_aware_weights(torch.zeros(3), torch.ones(3), 4)
    assert not sel.any() and w.abs().sum() == 0
