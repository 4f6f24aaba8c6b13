"""Method state between steps (`algos/state.py`): GEPO's entropy history, ACRL's adaptive band,
PIPO's reward window and replay, driven through `Algorithm` and saved with it."""
from __future__ import annotations

import pytest
import torch

from lmrl.algos import ADVANTAGES, Algorithm
from lmrl.algos.controllers import pipo_verdict
from lmrl.config import AlgoConfig, ConfigError
from lmrl.loading import build_config
from lmrl.validation import check_names
from lmrl.types import Sample, collate


def batch_of(rewards: list[float], groups: list[int], completion_len: int = 2):
    samples = [Sample(prompt_ids=[1, 2], completion_ids=[3 + i % 5] * completion_len,
                      behaviour_logprobs=[-1.0] * completion_len, reward=r) for i, r in enumerate(rewards)]
    return collate(samples, groups, pad_id=0)


def with_entropy(batch, per_row: list[float]):
    batch.extras["token_entropy"] = torch.tensor(per_row).unsqueeze(1) * batch.completion_mask
    return batch


def test_gepo_thresholds_come_from_earlier_batches_only():
    algo = Algorithm(AlgoConfig(advantage="gepo", advantage_params={"entropy_decay": 0.5, "alpha": 0.5}), 4)
    first = with_entropy(batch_of([1, 0, 1, 0], [0, 0, 1, 1]), [1.0, 1.0, 3.0, 3.0])
    algo.prepare(first)
    assert "entropy_mean" not in first.context  # no history yet: GEPO uses this batch's own statistics
    # history after groups with entropies 1 and 3 at decay 0.5: μ = 1 + 0.5·2 = 2, var = 0.5·(0 + 0.5·4) = 1
    assert algo.states["advantage"].stats.mean == pytest.approx(2.0)
    assert algo.states["advantage"].stats.std == pytest.approx(1.0)
    second = with_entropy(batch_of([1, 0, 1, 0], [0, 0, 1, 1]), [0.5, 0.5, 2.0, 2.0])
    algo.prepare(second)
    assert second.context["entropy_mean"] == pytest.approx(2.0)
    assert second.context["entropy_std"] == pytest.approx(1.0)
    base = ADVANTAGES.get("grpo")(second.sequence_rewards.unsqueeze(1) * second.completion_mask,
                                  second.group_index, second.completion_mask)
    # group 0 (H = 0.5 < τ_lo = 1): its positive advantage is halved; group 1 (H = 2, inside) unchanged
    expected = base.clone()
    expected[0] *= 0.5
    assert torch.allclose(second.advantages, expected)
    assert algo.after_update(second, {})["gepo/entropy_mean"] == algo.states["advantage"].stats.mean


def test_acrl_band_follows_the_measured_discrepancy_and_round_trips():
    algo = Algorithm(AlgoConfig(loss="acrl", loss_params={"acrl_band": 2.0, "acrl_d_high": 0.01}), 4)
    batch = batch_of([1, 0], [0, 0])
    algo.prepare(batch)
    assert batch.extras["acrl_band"].tolist() == [2.0, 2.0]
    assert algo.after_update(batch, {"acrl/discrepancy": 0.02}) == {"acrl/next_band": pytest.approx(1.6)}  # docs/methods/acrl.md
    nxt = batch_of([1, 0], [0, 0])
    algo.prepare(nxt)
    assert nxt.extras["acrl_band"].tolist() == pytest.approx([1.6, 1.6])
    saved = algo.state_dict()
    fresh = Algorithm(AlgoConfig(loss="acrl", loss_params={"acrl_band": 2.0}), 4)
    fresh.load_state_dict(saved)
    assert fresh.states["loss"].controller.band == pytest.approx(1.6)
    assert "acrl_d_high" not in algo.loss_knobs  # consumed by the state, not passed to the loss


def test_acrl_fixed_band_and_bad_controller_knobs():
    algo = Algorithm(AlgoConfig(loss="acrl", loss_params={"acrl_adaptive": False}), 4)
    algo.after_update(batch_of([1, 0], [0, 0]), {"acrl/discrepancy": 1.0})
    assert algo.states["loss"].controller.band == 2.0
    with pytest.raises(ValueError, match="kappa"):
        Algorithm(AlgoConfig(loss="acrl", loss_params={"acrl_kappa": 1.0}), 4)
    with pytest.raises(ValueError, match="acrl_band=20"):
        Algorithm(AlgoConfig(loss="acrl", loss_params={"acrl_band": 20.0}), 4)
    assert Algorithm(AlgoConfig(loss="acrl", loss_params={"acrl_band": 20.0, "acrl_adaptive": False}),
                     4).states["loss"].controller.band == 20.0
    check_names(build_config({"algo": {"loss": "acrl", "loss_params": {"acrl_d_low": 1e-4}}}))
    with pytest.raises(ConfigError, match="acrl_d_lo"):
        check_names(build_config({"algo": {"loss": "acrl", "loss_params": {"acrl_d_lo": 1e-4}}}))


def test_pipo_replays_the_previous_batch_with_the_verdict_times_its_advantages():
    algo = Algorithm(AlgoConfig(advantage="pipo", advantage_params={"pipo_window": 4}), 4)
    state = algo.states["advantage"]
    state.load_state_dict({"window": [0.40, 0.42, 0.44]})
    previous = batch_of([1, 0], [0, 0])
    algo.prepare(previous)
    base_previous = previous.advantages.clone()
    assert algo.replays(previous) == []  # nothing stored before it
    # now the window is [0.40, 0.42, 0.44, 0.46 (previous)], and the current batch's mean is 0.5
    assert state.monitor.window == pytest.approx([0.40, 0.42, 0.44, 0.5])
    state.load_state_dict({"window": [0.40, 0.42, 0.44, 0.46]})
    current = batch_of([1, 1, 0, 0], [0, 0, 1, 1])  # mean reward 0.5
    algo.prepare(current)
    assert torch.equal(current.advantages, ADVANTAGES.get("grpo")(
        current.sequence_rewards.unsqueeze(1) * current.completion_mask, current.group_index, current.completion_mask))
    metrics = algo.after_update(current, {})
    (replay,) = algo.replays(current)
    assert replay is previous
    xi = pipo_verdict([0.40, 0.42, 0.44, 0.46], 0.5)
    assert xi == pytest.approx(3.13, abs=0.01)  # docs/methods/pipo.md
    assert metrics["pipo/verdict"] == pytest.approx(xi)
    assert torch.allclose(replay.advantages, xi * base_previous)
    assert state.monitor.window == pytest.approx([0.42, 0.44, 0.46, 0.5])
