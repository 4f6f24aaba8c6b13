"""lmrl's preference, reward-model and GKD terms side by side with TRL's own loss code on the same random
inputs: values and gradients equal.

TRL's losses sit inside trainer methods. They are called on an instance made with `Trainer.__new__`
that carries only the attributes the method reads, and a stand-in model whose forward returns the
per-token log-probs (or scores) given here, so both sides differentiate the same leaf tensors.
"""
from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from trl import DPOTrainer, KTOTrainer  # noqa: E402
from trl.experimental.cpo import CPOTrainer  # noqa: E402
from trl.experimental.gkd import GKDTrainer  # noqa: E402
from trl.experimental.orpo import ORPOTrainer  # noqa: E402
from trl.trainer.reward_trainer import RewardTrainer  # noqa: E402

from lmrl.algos import AggScale, LossInputs  # noqa: E402
from lmrl.algos.preference_losses import generalized_jsd, kto_reference_point  # noqa: E402
from lmrl.algos.terms import ActiveTerm, compose  # noqa: E402

PAIRS, T = 4, 7
ACCELERATOR = SimpleNamespace(device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x)


def trainer(cls, **attributes):
    """An instance of a TRL trainer without its __init__: the attributes its loss code reads."""
    obj = cls.__new__(cls)
    common = {"model": SimpleNamespace(training=True), "accelerator": ACCELERATOR, "aux_loss_enabled": False,
              "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)}, "_total_train_tokens": 0,
              "_tp_size": 1}
    for name, value in {**common, **attributes}.items():
        object.__setattr__(obj, name, value)
    return obj


def fused_outputs(log_probs):
    """What TRL's fused LM head returns, with the per-token log-probs given (0 outside the labels)."""
    zeros = torch.zeros_like(log_probs.detach())
    return SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())


def random_rows(seed, rows, equal_lengths=False):
    g = torch.Generator().manual_seed(seed)
    n = torch.full((rows,), T) if equal_lengths else torch.randint(1, T + 1, (rows,), generator=g)
    mask = (torch.arange(T) < n[:, None]).float()
    logp = -torch.rand(rows, T, generator=g) * 3 - 0.05
    ref = -torch.rand(rows, T, generator=g) * 3 - 0.05
    return logp, ref, mask


def lmrl_pairs(logp, ref, mask, extras, name, **knobs):
    """Rows in TRL's order (chosen then rejected) interleaved for lmrl: chosen_0, rejected_0, chosen_1, ..."""
    order = torch.stack([torch.arange(PAIRS), torch.arange(PAIRS) + PAIRS], 1).flatten()
    leaf = logp[order].clone().requires_grad_(True)
    extras = {"pair": torch.arange(PAIRS).repeat_interleave(2), "chosen": torch.tensor([1.0, 0.0] * PAIRS),
              **{k: v[order] for k, v in extras.items()}}
    inputs = LossInputs(logp=leaf, old_logp=leaf.detach(), advantages=torch.zeros_like(mask), mask=mask[order],
                        ref_logp=ref[order], extras=extras)
    total, _ = compose([ActiveTerm(name, 1.0, knobs)], inputs, inputs.mask, AggScale.of(inputs.mask), "token_mean")
    total.backward()
    grad = torch.empty_like(leaf.grad)
    grad[order] = leaf.grad
    return total.detach(), grad


def trl_dpo(logp, ref, mask, loss_type, beta, label_smoothing):
    leaf = logp.clone().requires_grad_(True)
    completion_mask = torch.cat([torch.zeros(2 * PAIRS, 1), mask], 1)  # TRL's mask is over input_ids (one longer)
    ref_sums = (ref * mask).sum(1)
    inputs = {"input_ids": torch.ones(2 * PAIRS, T + 1, dtype=torch.long), "attention_mask": torch.ones(2 * PAIRS, T + 1),
              "completion_mask": completion_mask, "ref_chosen_logps": ref_sums[:PAIRS],
              "ref_rejected_logps": ref_sums[PAIRS:]}
    dpo = trainer(DPOTrainer, beta=beta, label_smoothing=label_smoothing, loss_types=[loss_type], loss_weights=[1.0],
                  ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl", use_weighting=False)
    loss = dpo._compute_loss(lambda **_: fused_outputs(leaf * mask), inputs, return_outputs=False)
    loss.backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("loss_type, beta, smoothing", [
    ("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.0), ("ipo", 0.1, 0.0), ("ipo", 0.3, 0.0), ("robust", 0.1, 0.1),
    ("robust", 0.2, 0.3), ("hinge", 0.1, 0.0), ("hinge", 1.0, 0.0),
])
def test_dpo_matches_trl_dpo_trainer(loss_type, beta, smoothing):
    logp, ref, mask = random_rows(1, 2 * PAIRS)
    ours, our_grad = lmrl_pairs(logp, ref, mask, {}, "dpo", beta=beta, loss_type=loss_type, label_smoothing=smoothing)
    theirs, their_grad = trl_dpo(logp, ref, mask, loss_type, beta, smoothing)
    assert torch.allclose(ours, theirs, atol=1e-6) and torch.allclose(our_grad, their_grad, atol=1e-7)


def test_trl_sigmoid_ignores_label_smoothing_which_lmrl_refuses():
    logp, ref, mask = random_rows(2, 2 * PAIRS)
    assert torch.equal(trl_dpo(logp, ref, mask, "sigmoid", 0.1, 0.2)[0], trl_dpo(logp, ref, mask, "sigmoid", 0.1, 0.0)[0])
    with pytest.raises(ValueError, match="no label smoothing"):
        lmrl_pairs(logp, ref, mask, {}, "dpo", loss_type="sigmoid", label_smoothing=0.2)


def average_and_grad_leaf(logp, mask):
    leaf = logp.clone().requires_grad_(True)
    return leaf, (leaf * mask).sum(1) / mask.sum(1)


@pytest.mark.parametrize("beta, gamma, smoothing", [(0.1, 0.5, 0.0), (2.0, 1.0, 0.0), (2.5, 1.4, 0.1)])
def test_simpo_matches_trl_cpo_loss(beta, gamma, smoothing):
    logp, ref, mask = random_rows(3, 2 * PAIRS)
    ours, our_grad = lmrl_pairs(logp, ref, mask, {}, "simpo", beta=beta, gamma=gamma, label_smoothing=smoothing)
    leaf, average = average_and_grad_leaf(logp, mask)
    cpo = trainer(CPOTrainer, alpha=0.0, loss_type="simpo", beta=beta, simpo_gamma=gamma, label_smoothing=smoothing)
    losses, _, _ = cpo.cpo_loss(average[:PAIRS], average[PAIRS:])
    losses.mean().backward()
    assert torch.allclose(ours, losses.mean().detach(), atol=1e-6) and torch.allclose(our_grad, leaf.grad, atol=1e-7)


@pytest.mark.parametrize("lam", [0.1, 1.0])
def test_orpo_matches_trl_odds_ratio_loss_plus_its_nll(lam):
    # TRL's NLL is the token mean over all chosen tokens of the batch: with equal chosen lengths it is the mean of
    # each chosen row's token mean, lmrl's per-pair form (docs/methods/preference.md)
    logp, ref, mask = random_rows(4, 2 * PAIRS)
    logp, mask = logp / 4, torch.cat([torch.ones(PAIRS, T), mask[PAIRS:]])
    ours, our_grad = lmrl_pairs(logp, ref, mask, {}, "orpo", lam=lam)
    leaf, average = average_and_grad_leaf(logp, mask)
    orpo = trainer(ORPOTrainer, beta=lam)
    losses = orpo.odds_ratio_loss(average[:PAIRS], average[PAIRS:])[0]
    nll = -(leaf[:PAIRS] * mask[:PAIRS]).sum() / mask[:PAIRS].sum()
    loss = nll - losses.mean()
    loss.backward()
    assert torch.allclose(ours, loss.detach(), atol=1e-6) and torch.allclose(our_grad, leaf.grad, atol=1e-7)


@pytest.mark.parametrize("beta, desirable_weight, undesirable_weight, kl_shift", [
    (0.1, 1.0, 1.0, 0.0), (0.5, 1.33, 1.0, 0.0), (0.1, 1.0, 0.7, -5.0),  # the last: z₀ clamped to 0
])
def test_kto_matches_trl_kto_trainer(beta, desirable_weight, undesirable_weight, kl_shift):
    rows = 2 * PAIRS
    logp, ref, mask = random_rows(5, rows)
    kl_logp, kl_ref, kl_mask = random_rows(6, rows)
    kl_logp = kl_logp + kl_shift / T
    label = torch.tensor([True, False, True, True, False, False, True, False])
    kl_sums = (kl_logp * kl_mask).sum(1)
    z0 = (kl_sums - (kl_ref * kl_mask).sum(1)).mean().clamp(min=0)

    leaf = logp.clone().requires_grad_(True)
    inputs = LossInputs(logp=leaf, old_logp=logp, advantages=torch.zeros_like(mask), mask=mask, ref_logp=ref,
                        extras={"desirable": label.float(),
                                "kto_z0": kto_reference_point((kl_logp - kl_ref).mul(kl_mask).sum(1))})
    ours, _ = compose([ActiveTerm("kto", 1.0, {"beta": beta, "desirable_weight": desirable_weight,
                                               "undesirable_weight": undesirable_weight})],
                      inputs, mask, AggScale.of(mask), "token_mean")
    ours.backward()

    trl_leaf = logp.clone().requires_grad_(True)
    input_ids, kl_ids = torch.ones(rows, T + 1, dtype=torch.long), torch.zeros(rows, T + 1, dtype=torch.long)
    pad = torch.zeros(rows, 1)
    batch = {"label": label, "input_ids": input_ids, "attention_mask": torch.ones(rows, T + 1),
             "completion_mask": torch.cat([pad, mask], 1), "KL_input_ids": kl_ids,
             "KL_attention_mask": torch.ones(rows, T + 1), "KL_completion_mask": torch.cat([pad, kl_mask], 1),
             "ref_logps": (ref * mask).sum(1), "ref_KL_logps": (kl_ref * kl_mask).sum(1)}

    def model(input_ids, **_):
        return fused_outputs(kl_logp * kl_mask if input_ids is kl_ids else trl_leaf * mask)

    kto = trainer(KTOTrainer, beta=beta, desirable_weight=desirable_weight, undesirable_weight=undesirable_weight,
                  loss_type="kto", calculate_KL=True, precompute_ref_logps=True)
    theirs = kto._compute_loss(model, batch, return_outputs=False)
    theirs.backward()
    assert float(z0) >= 0 and kto._metrics["train"]["kl"] == [pytest.approx(float(z0))]
    assert torch.allclose(ours.detach(), theirs.detach(), atol=1e-6)
    assert torch.allclose(leaf.grad, trl_leaf.grad, atol=1e-7)


@pytest.mark.parametrize("center, with_margin", [(None, False), (0.01, False), (None, True), (0.05, True)])
def test_bradley_terry_matches_trl_reward_trainer(center, with_margin):
    g = torch.Generator().manual_seed(7)
    scores, margin = torch.randn(2 * PAIRS, generator=g), torch.rand(PAIRS, generator=g)
    _, ref, mask = random_rows(8, 2 * PAIRS)
    order = torch.stack([torch.arange(PAIRS), torch.arange(PAIRS) + PAIRS], 1).flatten()
    ours_leaf = scores.clone().requires_grad_(True)
    extras = {"pair": torch.arange(PAIRS).repeat_interleave(2), "chosen": torch.tensor([1.0, 0.0] * PAIRS),
              "score": ours_leaf[order]}
    if with_margin:
        extras["margin"] = margin.repeat_interleave(2)
    inputs = LossInputs(logp=ref, old_logp=ref, advantages=torch.zeros_like(mask), mask=mask, ref_logp=ref,
                        extras=extras)
    ours, _ = compose([ActiveTerm("bradley_terry", 1.0, {"center_coef": center})], inputs, mask,
                      AggScale.of(mask), "token_mean")
    ours.backward()

    theirs_leaf = scores.clone().requires_grad_(True)
    reward = trainer(RewardTrainer, args=SimpleNamespace(center_rewards_coefficient=center))
    batch = {"attention_mask": torch.ones(2 * PAIRS, T), **({"margin": margin} if with_margin else {})}
    theirs = reward.compute_loss(lambda **_: SimpleNamespace(logits=theirs_leaf[:, None]), batch)
    theirs.backward()
    assert torch.allclose(ours.detach(), theirs.detach(), atol=1e-6)
    assert torch.allclose(ours_leaf.grad, theirs_leaf.grad, atol=1e-7)
    assert reward._metrics["train"]["accuracy"][0] == pytest.approx(
        float((scores[:PAIRS] > scores[PAIRS:]).float().mean()))


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.9])
def test_generalized_jsd_matches_trl_gkd(beta, temperature):
    g = torch.Generator().manual_seed(9)
    student, teacher = torch.randn(3, 5, 13, generator=g), torch.randn(3, 5, 13, generator=g) * 2
    labels = torch.randint(0, 13, (3, 5), generator=g)
    labels[0, :2] = labels[2, 4] = -100
    ours_leaf, theirs_leaf = student.clone().requires_grad_(True), student.clone().requires_grad_(True)
    mask = (labels != -100).float()
    ours = (generalized_jsd(ours_leaf, teacher, beta, temperature) * mask).sum() / mask.sum()
    theirs = GKDTrainer.generalized_jsd_loss(theirs_leaf, teacher, labels, beta=beta, temperature=temperature)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, atol=1e-6) and torch.allclose(ours_leaf.grad, theirs_leaf.grad, atol=1e-7)
