"""Reward aggregations: the spec's GDPO/RVPO numbers, C-MORAL bottleneck, hierarchical gates, and the scorer."""
import math

import pytest

from lmrl.config import RewardComponent, RewardConfig
from lmrl.loops.collect import rollout_metrics
from lmrl.rewards import REWARD_AGGREGATIONS, REWARD_FNS, RewardScorer
from lmrl.rewards.aggregations import bottleneck, gated, normalize_sum, sigmoid_align, soft_min
from lmrl.types import Group, Sample

R1, R2 = [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]
EQUAL = {"r1": 1.0, "r2": 1.0}


def test_registered():
    for name in ("normalize_sum", "soft_min", "bottleneck", "gated"):
        assert name in REWARD_AGGREGATIONS


def test_normalize_sum_spec_case():
    out = normalize_sum({"r1": R1, "r2": R2}, EQUAL)
    assert out == pytest.approx([1.732, 0.0, 0.0, -1.732], abs=1e-3)
    weighted = normalize_sum({"r1": R1, "r2": R2}, {"r1": 2.0, "r2": 0.5})
    a = 0.5 / math.sqrt(1 / 3) / (1 + 1e-4 / math.sqrt(1 / 3))  # 0.866 with eps
    assert weighted == pytest.approx([2.5 * a, 1.5 * a, -1.5 * a, -2.5 * a], rel=1e-6)


def test_normalize_sum_scale_invariance_and_constants():
    dense = normalize_sum({"big": [100.0, 300.0], "small": [0.0, 1.0]}, {"big": 1.0, "small": 1.0})
    assert dense[1] - dense[0] == pytest.approx(2 * 2 * 0.7071, rel=1e-3)  # each component counts equally
    assert normalize_sum({"c": [5.0, 5.0, 5.0]}, {"c": 1.0}) == [0.0, 0.0, 0.0]


def test_soft_min_spec_case():
    assert soft_min({"r1": R1, "r2": R2}, EQUAL, tau=1.0) == pytest.approx([0.866, -0.336, -0.336, -0.866], abs=1e-3)


def test_soft_min_single_checks_and_limits():
    raw = {"a": [1.0, 0.5], "b": [-1.0, 0.5]}
    assert soft_min(raw, {}, tau=1.0, normalize=False) == pytest.approx([-0.4338, 0.5], abs=1e-4)
    big_tau = soft_min(raw, {}, tau=1e4, normalize=False)
    assert big_tau[0] == pytest.approx(0.0, abs=1e-3)  # → the mean
    small_tau = soft_min(raw, {}, tau=1e-3, normalize=False)
    assert small_tau[0] == pytest.approx(-1.0, abs=1e-2)  # → the minimum


def test_soft_min_weights():
    raw = {"a": [1.0], "b": [-1.0]}
    expected = -math.log(0.75 * math.exp(-1.0) + 0.25 * math.exp(1.0))
    assert soft_min(raw, {"a": 3.0, "b": 1.0}, tau=1.0, normalize=False) == pytest.approx([expected])
    assert soft_min(raw, {"a": 1.0, "b": 0.0}, normalize=False) == pytest.approx([1.0])  # zero weight: left out
    with pytest.raises(ValueError, match="tau"):
        soft_min(raw, {}, tau=0.0)
    with pytest.raises(ValueError, match=">= 0"):
        soft_min(raw, {"a": -1.0}, normalize=False)


def test_bottleneck_geometric_min_product():
    comps = {"qed": [0.9, 0.5], "sim": [0.1, 0.5]}
    geo = bottleneck(comps, {})
    assert geo[0] == pytest.approx(math.sqrt(0.900001 * 0.100001))
    assert geo[1] == pytest.approx(0.500001)
    assert geo[0] < geo[1]  # same arithmetic mean, but the first sample has a bottleneck
    assert bottleneck(comps, {}, mode="min") == [0.1, 0.5]
    assert bottleneck(comps, {}, mode="product") == pytest.approx([0.09, 0.25])
    assert bottleneck(comps, {"qed": 3.0, "sim": 1.0})[0] == pytest.approx((0.729 * 0.1) ** 0.25, rel=1e-4)
    assert bottleneck({"a": [0.0], "b": [1.0]}, {})[0] == pytest.approx(math.sqrt(1e-6 * (1 + 1e-6)))


def test_bottleneck_alignment_and_range_check():
    assert sigmoid_align(0.7, target=0.6, slope=10) == pytest.approx(1 / (1 + math.exp(-1)))
    assert sigmoid_align(0.7, target=0.6, slope=10, direction="minimize") == pytest.approx(1 / (1 + math.exp(1)))
    assert sigmoid_align(-1e4, target=0.0) == pytest.approx(0.0)  # no overflow
    out = bottleneck({"logp": [2.0], "ok": [1.0]}, {}, align={"logp": {"target": 2.0, "slope": 4.0}})
    assert out[0] == pytest.approx(math.sqrt(0.500001 * 1.000001))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        bottleneck({"logp": [2.0]}, {})
    with pytest.raises(ValueError, match="unknown components"):
        bottleneck({"a": [0.5]}, {}, align={"b": {"target": 0.0}})
    with pytest.raises(ValueError, match="mode"):
        bottleneck({"a": [0.5]}, {}, mode="harmonic")


def test_gated_milmmt_spec_case():
    comps = {"language_match": [0.0, 1.0], "qe_a": [0.9, 0.8], "qe_b": [0.9, 0.6]}
    out = gated(comps, {}, gates={"language_match": 1.0}, combine="mean")
    assert out == pytest.approx([0.0, 0.7])


def test_gated_hierarchy_and_options():
    comps = {"format": [0.0, 1.0, 1.0], "answer": [1.0, 0.0, 1.0], "length": [-0.2, -0.4, -0.5]}
    gates = {"format": 1.0, "answer": 1.0}
    assert gated(comps, {}, gates=gates) == pytest.approx([0.0, 0.0, -0.5])
    assert gated(comps, {}, gates=gates, partial_credit=0.1, fail_value=-1.0) == pytest.approx([-1.0, -0.9, -0.3])
    assert gated(comps, {"length": 2.0}, gates=gates, include_gates=True) == pytest.approx([0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="gates"):
        gated(comps, {})
    with pytest.raises(ValueError, match="unknown components"):
        gated(comps, {}, gates={"fmt": 1.0})


def _group(texts, answer="7"):
    return Group("g", {}, [Sample([1], [0] * n, [0.0] * n, text=t, row={"answer": answer})
                           for n, t in zip((4, 8, 12, 16), texts)])


def test_scorer_aggregates_and_keeps_every_component_logged():
    cfg = RewardConfig(components=[RewardComponent(name="answer"), RewardComponent(name="format"),
                                   RewardComponent(name="length", weight=0.5, params={"target": 16})],
                       aggregation="gated", aggregation_params={"gates": {"format": 1.0}})
    group = _group(["Answer: 7", "so 7", "Answer: 8", "Answer: 7"])
    RewardScorer(cfg).score([group])
    expected = [1 - 0.5 * 4 / 16, 0.0, 0 - 0.5 * 12 / 16, 1 - 0.5 * 16 / 16]
    assert [s.reward for s in group.samples] == pytest.approx(expected)
    metrics = rollout_metrics([group], "answer")
    for name in ("answer", "format", "length"):
        assert f"reward/{name}" in metrics
    assert metrics["reward/format"] == pytest.approx(0.75)


def test_scorer_with_normalize_sum_matches_the_function():
    cfg = RewardConfig(components=[RewardComponent(name="answer"), RewardComponent(name="format", weight=2.0)],
                       aggregation="normalize_sum")
    group = _group(["Answer: 7", "so 7", "Answer: 8", "Answer: 7"])
    RewardScorer(cfg).score([group])
    answer = [REWARD_FNS.get("answer")(s) for s in group.samples]
    fmt = [REWARD_FNS.get("format")(s) for s in group.samples]
    assert [s.reward for s in group.samples] == pytest.approx(
        normalize_sum({"answer": answer, "format": fmt}, {"answer": 1.0, "format": 2.0}))


@pytest.mark.parametrize("recipe", ["abstention", "multi_objective"])
def test_recipes_validate_and_score(recipe):
    from lmrl.loading import load_config
    from lmrl.validation import check_names

    cfg = load_config(recipe)
    check_names(cfg)
    group = _group(["Answer: 7", "so 7", "Answer: I don't know", "Answer: 8"])
    RewardScorer(cfg.reward).score([group])
    rewards = [s.reward for s in group.samples]
    assert all(r is not None for r in rewards)
    assert rewards[0] == max(rewards)  # the right, well-formed answer wins either way
    if recipe == "abstention":
        assert rewards == [1.0, 1.0, 0.0, -1.0]  # lam 1, last-number fallback grades "so 7"
