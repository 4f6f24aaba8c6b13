"""The objective's terms: which ones the config switches on (keys and `algo.terms`), and each denominator on hand-made values."""
from __future__ import annotations

import pytest
import torch

from lmrl.algos import AggScale, LossInputs
from lmrl.algos.terms import ActiveTerm, active_terms, compose
from lmrl.config import AlgoConfig


def test_config_keys_switch_on_terms_in_their_summation_order():
    cfg = AlgoConfig(kl_coef=0.1, entropy_coef=0.02, critic=True, advantage="gae", value_coef=0.7,
                     terms=[{"name": "demo_nll", "coef": 0.3}, {"name": "distill", "coef": 0.4}])
    terms = active_terms(cfg)
    assert [(t.name, t.coef) for t in terms] == [("policy_gradient", 1.0), ("kl", 0.1), ("entropy", -0.02),
                                                  ("value", 0.7), ("demo_nll", 0.3), ("distill", 0.4)]
    assert [t.name for t in active_terms(AlgoConfig(kl_coef=0.1, kl_in_reward=True))] == ["policy_gradient"]


def inputs_of(**extras):
    logp = torch.tensor([[-1.0, -3.0], [-2.0, -2.0]])
    return LossInputs(logp=logp, old_logp=logp, advantages=torch.zeros(2, 2), mask=torch.ones(2, 2),
                      ref_logp=torch.tensor([[-1.5, -3.0], [-2.0, -1.0]]), extras=extras)


def test_a_sequences_term_divides_by_the_whole_batch_rows():
    # row means of -log p: 2 and 2; only row 0 is a demonstration; the mini-batch has 4 rows
    total, metrics = compose([ActiveTerm("demo_nll", 0.5)], inputs_of(demonstration=torch.tensor([1.0, 0.0])),
                             torch.ones(2, 2), AggScale(num_tokens=8, num_seqs=4, horizon=2), "token_mean")
    assert float(total) == pytest.approx(0.5 * 2.0 / 4) and metrics == {"demo_nll": pytest.approx(2.0)}
    total, metrics = compose([ActiveTerm("demo_nll", 0.5)], inputs_of(), torch.ones(2, 2),
                             AggScale(8, 4, 2), "token_mean")
    assert float(total) == 0.0 and metrics == {}  # no demonstration rows in this micro-batch: no term


def test_per_token_terms_share_the_algorithm_aggregation():
    # k1 = log p - log p_ref: 0.5, 0, 0, -1; seq_mean_token_mean: (0.25 + (-0.5)) / 2 rows; coef 0.2
    mask = torch.ones(2, 2)
    total, metrics = compose([ActiveTerm("kl", 0.2, {"estimator": "k1"})], inputs_of(), mask,
                             AggScale.of(mask), "seq_mean_token_mean")
    assert float(total) == pytest.approx(0.2 * (0.25 - 0.5) / 2)
    assert metrics["kl"] == pytest.approx(-0.125)
