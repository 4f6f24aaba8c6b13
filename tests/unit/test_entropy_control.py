"""Entrocraft and GEPO against the checks of docs/methods/{entrocraft,gepo}.md and values computed by hand."""
import math

import numpy as np
import pytest
import torch

from algo_helpers import adv, seq
from algo_helpers import run_estimator as run
from lmrl.algos.entropy_control import GroupEntropyStats, entrocraft_mode, entropy_bounds, gepo_shape, group_token_mean
from lmrl.loading import build_config
from lmrl.validation import check_names


SQRT_HALF = math.sqrt(0.5)  # GRPO advantage of rewards [1, 0]: ±0.5 / std([1, 0]) = ±0.7071


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
