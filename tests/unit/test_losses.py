"""Policy losses, aggregation and KL estimators against specs/algorithms.md §0 and hand computations."""
import math

import pytest
import torch

from lmrl.algos import AGGREGATIONS, KL_ESTIMATORS, LOSSES, AggScale, LossInputs
from lmrl.algos.shaping import overlong_penalty


def inputs(log_ratio, adv, mask=None):
    lr = torch.tensor([log_ratio], dtype=torch.float)
    logp = torch.zeros_like(lr, requires_grad=True)
    a = torch.full_like(lr, adv) if isinstance(adv, (int, float)) else torch.tensor([adv], dtype=torch.float)
    return logp, LossInputs(logp=logp, old_logp=-lr, advantages=a, mask=torch.ones_like(lr) if mask is None else mask)


def test_ppo_clip_positive_advantage_clips_high_ratio():
    logp, x = inputs([math.log(1.5), math.log(1.1), math.log(0.5)], 1.0)
    loss, m = LOSSES.get("ppo_clip")(x, eps_low=0.2, eps_high=0.28)
    assert loss[0].tolist() == pytest.approx([-1.28, -1.1, -0.5], abs=1e-5)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.1, -0.5], abs=1e-5)
    assert m["clip_frac"] == pytest.approx(1 / 3)


def test_ppo_clip_negative_advantage_clips_low_ratio():
    _, x = inputs([math.log(0.5), math.log(1.5)], -1.0)
    loss, _ = LOSSES.get("ppo_clip")(x, eps_low=0.2, eps_high=0.28)
    assert loss[0].tolist() == pytest.approx([0.8, 1.5], abs=1e-5)


def test_dual_clip_caps_negative_advantage_loss():
    _, x = inputs([math.log(5.0), math.log(2.0)], -1.0)
    loss, m = LOSSES.get("ppo_clip")(x, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    assert loss[0].tolist() == pytest.approx([3.0, 2.0], abs=1e-5)
    assert m["clip_frac"] == pytest.approx(0.5)


def test_dual_clip_leaves_positive_advantages_alone():
    _, x = inputs([math.log(5.0)], 1.0)
    loss, _ = LOSSES.get("ppo_clip")(x, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    assert loss.item() == pytest.approx(-1.2)


def test_gspo_spec_value():
    logp, x = inputs([0.1, -0.1, 0.3], 1.0)
    loss, _ = LOSSES.get("gspo")(x, eps_low=3e-4, eps_high=4e-4)
    assert loss.mean().item() == pytest.approx(-1.0004, abs=1e-6)
    loss.sum().backward()
    assert torch.all(logp.grad == 0)  # clipped: no gradient


def test_gspo_uses_one_ratio_per_sequence():
    logp, x = inputs([0.001, -0.001, 0.0], 1.0)
    loss, m = LOSSES.get("gspo")(x, eps_low=0.2, eps_high=0.2)
    assert m["ratio_mean"] == pytest.approx(1.0)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, -1.0, -1.0], abs=1e-5)


def test_pg_is_reinforce_on_policy():
    logp, x = inputs([0.0, 0.0], [2.0, -1.0])
    loss, _ = LOSSES.get("pg")(x)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-2.0, 1.0])


def test_aggregations_spec_value():
    loss = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    scale = AggScale.of(mask, horizon=4)
    assert AGGREGATIONS.get("seq_mean_token_sum_norm")(loss, mask, scale).item() == pytest.approx(1.5)
    assert AGGREGATIONS.get("token_mean")(loss, mask, scale).item() == pytest.approx(1.0)
    loss2 = torch.tensor([[2.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert AGGREGATIONS.get("token_mean")(loss2, mask, scale).item() == pytest.approx(8 / 6)
    assert AGGREGATIONS.get("seq_mean_token_mean")(loss2, mask, scale).item() == pytest.approx(1.5)


def test_aggregation_is_additive_over_micro_batches():
    loss = torch.rand(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1
    for name in AGGREGATIONS.names():
        fn = AGGREGATIONS.get(name)
        scale = AggScale.of(mask, horizon=5)
        whole = fn(loss, mask, scale)
        parts = fn(loss[:2], mask[:2], scale) + fn(loss[2:], mask[2:], scale)
        assert whole.item() == pytest.approx(parts.item(), rel=1e-6), name


def test_kl_estimators():
    logp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-0.5, -1.0])
    assert KL_ESTIMATORS.get("k1")(logp, ref).tolist() == pytest.approx([0.5, 0.0])
    assert KL_ESTIMATORS.get("k2")(logp, ref).tolist() == pytest.approx([0.125, 0.0])
    assert KL_ESTIMATORS.get("k3")(logp, ref).tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, 0.0])
    assert KL_ESTIMATORS.get("k3")(torch.tensor([-30.0]), torch.tensor([0.0])).item() == 10.0  # clamped


def test_dapo_overlong_spec_value():
    pen = overlong_penalty(torch.tensor([18432, 16384, 20480, 100]), max_len=20480, buffer=4096)
    assert pen.tolist() == pytest.approx([-0.5, 0.0, -1.0, 0.0])
