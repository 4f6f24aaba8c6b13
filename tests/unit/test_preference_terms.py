"""Preference, reward-model and GKD losses on the spec's hand-computed values (stages_and_credit.md §2.1–2.6,
§3.1, §4.1), as pure functions and as objective terms: the mean over pairs and its gradient, exactly."""
from __future__ import annotations

import math

import pytest
import torch

from lmrl.algos import AggScale, LossInputs
from lmrl.algos.preference import Pairs
from lmrl.algos.preference_losses import (bradley_terry_loss, dpo_loss, generalized_jsd, kto_loss, kto_reference_point,
                                          orpo_loss, pairwise_accuracy, simpo_loss)
from lmrl.algos.terms import TERMS, ActiveTerm, compose
from lmrl.config import AlgoConfig, Config

T = torch.tensor
JUNK = -7.0  # log-probs on tokens outside the loss mask: any value, never read


def approx(x, rel=None, abs=5e-5):
    return pytest.approx(x, rel=rel, abs=abs)


# §2.1–2.3: logπ(y_w) = −10, logπ(y_l) = −12, logπ_ref = −11 → h_w = 1, h_l = −1, z = 2; |y_w| = 5, |y_l| = 4
@pytest.mark.parametrize("loss_type, smoothing, expected", [
    ("sigmoid", 0.0, 0.5981), ("cdpo", 0.1, 0.6181), ("robust", 0.1, 0.5731), ("hinge", 0.0, 0.8), ("ipo", 0.0, 20.7025),
])
def test_dpo_losses_on_the_spec_pair(loss_type, smoothing, expected):
    loss, chosen, rejected = dpo_loss(T([1.0]), T([-1.0]), 0.1, loss_type, smoothing, T([5.0]), T([4.0]))
    assert float(loss) == approx(expected) and float(chosen) == approx(0.1) and float(rejected) == approx(-0.1)


def test_ipo_without_length_normalisation_is_openrlhf_form():
    loss, _, _ = dpo_loss(T([1.0]), T([-1.0]), 0.1, "ipo", ipo_length_norm=False)
    assert float(loss) == approx(9.0)


def test_reference_free_dpo_is_dpo_on_the_policy_log_probs():
    loss, chosen, _ = dpo_loss(T([-10.0]), T([-12.0]), 0.1)  # z = 2 again, rewards β·logπ
    assert float(loss) == approx(0.5981) and float(chosen) == approx(-1.0)


@pytest.mark.parametrize("loss_type, smoothing, error", [
    ("sigmoid", 0.1, "no label smoothing"), ("ipo", 0.2, "no label smoothing"), ("robust", 0.5, r"\[0, 0.5\)"),
    ("exo_pair", 0.0, "not one of"),
])
def test_dpo_refuses_label_smoothing_it_would_ignore_and_unknown_losses(loss_type, smoothing, error):
    with pytest.raises(ValueError, match=error):
        dpo_loss(T([1.0]), T([-1.0]), 0.1, loss_type, smoothing)


def test_simpo_at_trl_defaults_and_at_the_paper_scale():
    avg_w, avg_l = T([-10.0 / 5]), T([-12.0 / 4])
    assert float(simpo_loss(avg_w, avg_l)[0]) == approx(0.9130)
    assert float(simpo_loss(avg_w, avg_l, beta=2.0, gamma=1.0)[0]) == approx(0.3133)


def test_orpo_log_odds_ratio_and_loss():
    loss, log_odds_ratio = orpo_loss(T([-0.5]), T([-1.5]), T([0.5]), lam=0.1)
    assert float(log_odds_ratio) == approx(1.6803) and float(loss) == approx(0.5171)
    loss, _ = orpo_loss(T([-1e-6], dtype=torch.bfloat16), T([-40.0]), T([0.0]))  # near log(1 − e⁰): stays finite
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all()


def test_kto_reference_point_and_losses():
    z0 = kto_reference_point(T([0.5, 1.5]))
    assert float(z0) == 1.0 and float(kto_reference_point(T([-0.5, -1.5]))) == 0.0
    loss, _ = kto_loss(T([2.0, -1.0]), T([1.0, 0.0]), z0, beta=0.1)
    assert loss.tolist() == [approx(0.4750), approx(0.4502)] and float(loss.mean()) == approx(0.4626)
    weighted, _ = kto_loss(T([2.0, -1.0]), T([1.0, 0.0]), z0, beta=0.1, desirable_weight=1.33)
    assert float(weighted.mean()) == approx(0.5410)


def test_bradley_terry_margin_centering_accuracy():
    r_w, r_l = T([1.0, 0.1]), T([0.2, 0.4])
    loss = bradley_terry_loss(r_w, r_l)
    assert loss.tolist() == [approx(0.3711), approx(0.8544)] and float(loss.mean()) == approx(0.6127)
    assert float(bradley_terry_loss(r_w, r_l, margin=T([0.5, 0.0])).mean()) == approx(0.7044)
    centred = bradley_terry_loss(r_w, r_l, center_coef=0.01).mean()
    assert float(centred - loss.mean()) == approx(0.0084) and float(centred) == approx(0.6212)
    assert float(pairwise_accuracy(r_w, r_l)) == 0.5 and float(pairwise_accuracy(T([1.0]), T([1.0]))) == 0.0


@pytest.mark.parametrize("beta, expected", [(0.0, 0.0851), (1.0, 0.0920), (0.5, 0.0219), (0.9, 0.0082)])
def test_generalized_jsd_on_one_token(beta, expected):
    student, teacher = T([[[0.5, 0.3, 0.2]]]).log(), T([[[0.7, 0.2, 0.1]]]).log()
    value = generalized_jsd(student + 3.0, teacher, beta=beta)  # logits: a shift changes nothing
    assert value.shape == (1, 1) and float(value) == approx(expected)


def test_generalized_jsd_temperature_scales_the_logits():
    student, teacher = torch.randn(2, 3, 11), torch.randn(2, 3, 11)
    assert torch.allclose(generalized_jsd(student, teacher, 0.5, temperature=2.0),
                          generalized_jsd(student / 2, teacher / 2, 0.5))


# Two pairs in one micro-batch, rows shuffled, pair ids 7 and 3; T = 5 tokens, the last masked on 4-token rows.
# pair 7: chosen 5 × −2 = −10, rejected 4 × −3 = −12 → h = (1, −1), z = 2 (the spec's pair)
# pair 3: chosen 4 × −3 = −12, rejected 5 × −1.8 = −9 → h = (−1, 2), z = −3; every reference completion −11
ROWS = [  # (pair, chosen, per-token logp, length)
    (7, 0.0, -3.0, 4), (3, 1.0, -3.0, 4), (7, 1.0, -2.0, 5), (3, 0.0, -1.8, 5)]


def pair_inputs(rows=ROWS, ref_total=-11.0, **extras) -> LossInputs:
    mask = T([[1.0] * n + [0.0] * (5 - n) for *_, n in rows])
    logp = T([[v] * n + [JUNK] * (5 - n) for _, _, v, n in rows]).requires_grad_(True)
    ref = T([[ref_total / n] * n + [JUNK] * (5 - n) for *_, n in rows])
    extras = {"pair": T([p for p, *_ in rows]), "chosen": T([c for _, c, *_ in rows]), **extras}
    return LossInputs(logp=logp, old_logp=logp.detach(), advantages=torch.zeros_like(mask), mask=mask,
                      ref_logp=ref, extras=extras)


def objective(name, inputs, coef=1.0, **knobs):
    return compose([ActiveTerm(name, coef, knobs)], inputs, inputs.mask, AggScale.of(inputs.mask), "token_mean")


def test_pairs_are_found_by_id_whatever_the_row_order():
    pairs = Pairs.of(pair_inputs().extras)
    assert pairs.chosen_row.tolist() == [1, 2] and pairs.rejected_row.tolist() == [3, 0]  # ids in order: 3, 7
    assert pairs.of_row.tolist() == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="exactly one chosen and one rejected"):
        Pairs.of({"pair": T([1, 1, 2, 2]), "chosen": T([1.0, 1.0, 1.0, 0.0])})
    with pytest.raises(ValueError, match="exactly one chosen and one rejected"):
        Pairs.of({"pair": T([1, 1, 2]), "chosen": T([1.0, 0.0, 1.0])})


@pytest.mark.parametrize("loss_type, smoothing, pair7, pair3", [
    ("sigmoid", 0.0, 0.598139, 0.854355), ("cdpo", 0.1, 0.618139, 0.824355), ("robust", 0.1, 0.573139, 0.891855),
    ("hinge", 0.0, 0.8, 1.3), ("ipo", 0.0, 20.7025, 31.9225),  # pair 3: (−1/4 − 2/5 − 5)²
])
def test_the_dpo_term_is_the_mean_over_pairs(loss_type, smoothing, pair7, pair3):
    total, metrics = objective("dpo", pair_inputs(), coef=0.5, loss_type=loss_type, label_smoothing=smoothing)
    assert total.item() == approx(0.5 * (pair7 + pair3) / 2)
    assert metrics["pref/loss"] == approx((pair7 + pair3) / 2) and metrics["pref/reward_accuracy"] == 0.5
    assert metrics["pref/chosen_reward"] == approx((0.1 - 0.1) / 2)
    assert metrics["pref/rejected_reward"] == approx((-0.1 + 0.2) / 2)
    assert metrics["pref/margin"] == approx((0.2 - 0.3) / 2)


def test_the_sigmoid_dpo_gradient_is_the_hand_derived_one():
    # d/dz of −logσ(βz) is −β·σ(−βz), over P = 2 pairs: ∓β·σ(−βz)/2 on each chosen / rejected completion token
    inputs = pair_inputs()
    total, _ = objective("dpo", inputs)
    total.backward()
    g7, g3 = 0.1 * (1 - 1 / (1 + math.exp(-0.2))) / 2, 0.1 * (1 - 1 / (1 + math.exp(0.3))) / 2
    assert g7 == approx(0.0225083, abs=1e-7) and g3 == approx(0.0287221, abs=1e-7)
    expected = T([[g7] * 4 + [0.0], [-g3] * 4 + [0.0], [-g7] * 5, [g3] * 5])
    assert torch.allclose(inputs.logp.grad, expected, atol=1e-7)


def test_micro_batches_of_one_pair_each_sum_to_the_whole():
    whole = pair_inputs()
    total, _ = objective("dpo", whole, loss_type="ipo")
    scale = AggScale.of(whole.mask)
    parts = [compose([ActiveTerm("dpo", 1.0, {"loss_type": "ipo"})], part, part.mask, scale, "token_mean")[0]
             for part in (pair_inputs([ROWS[0], ROWS[2]]), pair_inputs([ROWS[1], ROWS[3]]))]
    assert sum(parts).item() == approx(total.item(), abs=1e-5) and total.item() == approx((20.7025 + 31.9225) / 2)


def test_reference_free_dpo_and_simpo_terms():
    # reference-free: h = logπ: pair 7 z = −10 − (−12) = 2, pair 3 z = −12 − (−9) = −3 (as with the reference)
    total, metrics = objective("dpo_reference_free", pair_inputs(ref_total=0.0))
    assert total.item() == approx((0.598139 + 0.854355) / 2) and metrics["pref/chosen_reward"] == approx(-1.1)
    assert "ref_logp" not in TERMS.spec("dpo_reference_free").inputs and "ref_logp" in TERMS.spec("dpo").inputs
    # SimPO: pair 7 ā = (−2, −3) → 0.9130; pair 3 ā = (−3, −1.8) → −logσ(0.1·(−1.2) − 0.5) = 1.0504
    total, metrics = objective("simpo", pair_inputs())
    assert total.item() == approx((0.913015 + 1.050447) / 2) and metrics["pref/reward_accuracy"] == 0.5


def test_orpo_term_adds_the_chosen_nll():
    # pair 1: ā = (−0.5, −1.5) → 0.5171; pair 2 swapped: LOR = −1.6803, 1.5 − 0.1·logσ(−1.6803) = 1.6851
    rows = [(1, 1.0, -0.5, 4), (1, 0.0, -1.5, 5), (2, 1.0, -1.5, 5), (2, 0.0, -0.5, 4)]
    inputs = pair_inputs(rows)
    total, metrics = objective("orpo", inputs)
    assert total.item() == approx((0.517086 + 1.685113) / 2) and metrics["pref/nll"] == approx(1.0)
    assert metrics["pref/log_odds_ratio"] == approx(0.0)
    total.backward()
    # pair 1's chosen tokens: (−1 − λ·σ(−LOR)·∂LOR/∂ā_w) / (|y_w| · P), ∂LOR/∂ā_w = 1/(1 − e^ā_w); rejected:
    # +λ·σ(−LOR)/(1 − e^ā_l) / (|y_l| · P)
    s = 1 / (1 + math.exp(1.6802697))
    chosen = (-1 - 0.1 * s / (1 - math.exp(-0.5))) / 8
    rejected = 0.1 * s / (1 - math.exp(-1.5)) / 10
    assert torch.allclose(inputs.logp.grad[:2], T([[chosen] * 4 + [0.0], [rejected] * 5]), atol=1e-6)


def test_kto_term_on_unpaired_rows():
    # one desirable row h = 2, one undesirable h = −1 (reference 0), z₀ = 1 from the batch's KL pairs
    logp = T([[1.0, 1.0, JUNK], [-0.5, -0.5, JUNK]], requires_grad=True)
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    inputs = LossInputs(logp=logp, old_logp=logp.detach(), advantages=torch.zeros_like(mask), mask=mask,
                        ref_logp=torch.zeros_like(mask), extras={"desirable": T([1.0, 0.0]), "kto_z0": T(1.0)})
    total, metrics = objective("kto", inputs)
    assert total.item() == approx(0.4626) and metrics["pref/kl_reference"] == 1.0
    assert metrics["pref/chosen_reward"] == approx(0.2) and metrics["pref/rejected_reward"] == approx(-0.1)
    total, _ = objective("kto", inputs, desirable_weight=1.33)
    assert total.item() == approx(0.5410)


def test_bradley_terry_term_reads_scores_and_margins():
    extras = {"pair": T([5, 9, 5, 9]), "chosen": T([1.0, 0.0, 0.0, 1.0]), "score": T([1.0, 0.4, 0.2, 0.1])}
    inputs = pair_inputs(**extras)
    total, metrics = objective("bradley_terry", inputs)
    assert total.item() == approx(0.6127)
    assert metrics == {"rm/loss": approx(0.6127), "rm/accuracy": 0.5, "rm/margin": approx((0.8 - 0.3) / 2)}
    total, _ = objective("bradley_terry", pair_inputs(**extras, margin=T([0.5, 0.0, 0.5, 0.0])))
    assert total.item() == approx(0.7044)
    total, _ = objective("bradley_terry", inputs, center_coef=0.01)
    assert total.item() == approx(0.6212)


def test_the_terms_declare_pairs_sequences_and_a_config_check():
    for name in ("dpo", "dpo_reference_free", "simpo", "orpo", "bradley_terry"):
        spec = TERMS.spec(name)
        assert spec.pairwise and spec.denominator == "sequences" and {"pair", "chosen"} <= spec.inputs
    assert not TERMS.spec("kto").pairwise and {"desirable", "kto_z0", "ref_logp"} <= TERMS.spec("kto").inputs
    check, cfg = TERMS.spec("dpo").check, Config(algo=AlgoConfig())
    assert check(cfg) is None and check(cfg, loss_type="cdpo", label_smoothing=0.1) is None
    assert "no label smoothing" in check(cfg, label_smoothing=0.1)
