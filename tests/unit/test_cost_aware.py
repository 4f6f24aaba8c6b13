"""Cost-Aware GRPO's sampler against docs/methods/cost_aware_grpo.md, alone and inside the Algorithm."""
import pytest
import torch

from lmrl.algos import Algorithm
from lmrl.algos.cost_aware import cost_aware_probs, cost_aware_weights
from lmrl.config import AlgoConfig
from lmrl.types import Batch


A = torch.tensor([1.0, -1.0, 0.5, 0.0])
L = torch.tensor([100.0, 400.0, 100.0, 50.0])


def t(x):
    return torch.tensor(x, dtype=torch.float)


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


def test_cost_aware_draw_keeps_weighted_rows_and_zeroes_the_rest():
    batch = Batch(torch.zeros(4, 4, dtype=torch.long), torch.ones(4, 4, dtype=torch.long),
                  t([[0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 1, 0]]), torch.zeros(4, 3), t([1, 0, 0, 1]),
                  torch.tensor([0, 0, 0, 0]))
    Algorithm(AlgoConfig(), 2).prepare(batch)
    grpo = batch.advantages.clone()
    torch.manual_seed(0)
    metrics = Algorithm(AlgoConfig(shaping=[{"name": "cost_aware", "params": {"fraction": 0.5}}]), 2).prepare(batch)
    torch.manual_seed(0)
    per_row = (grpo * batch.completion_mask).sum(1) / batch.completion_mask.sum(1)
    selected, weights = cost_aware_weights(per_row, batch.completion_mask.sum(1), 2)
    assert torch.allclose(batch.advantages, grpo * weights.unsqueeze(1))
    assert metrics["cost_aware/selected_frac"] == float(selected.float().mean()) <= 0.5
    assert Algorithm(AlgoConfig(shaping=[{"name": "cost_aware", "params": {"fraction": 0.5}}]), 2).inert_rows(batch).tolist() == (~selected).tolist()
