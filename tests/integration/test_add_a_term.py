"""Adding an objective term touches no config, algorithm, validation or loop file (docs/architecture.md,
"The objective as terms"): a regulariser registered here, an L2 pull of the log-probs toward the
reference's, is switched on by `algo.terms`, enters the objective with its own denominator, and
a tiny model trains with it."""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.algos import Algorithm, AggScale, LossInputs
from lmrl.algos.terms import TERMS
from lmrl.config import ConfigError
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama


@TERMS.register("logp_l2", "mean over tokens of |log π − log π_ref|^power", inputs={"logp", "ref_logp"},
                denominator="tokens")
def logp_l2(inputs, mask, power: float = 2.0):
    value = (inputs.logp - inputs.ref_logp).abs() ** power
    return value, {"logp_l2": float((value.detach() * mask).sum() / mask.sum().clamp(min=1))}


def term_config(tmp_path, steps=2, **term):
    return toy_run_config(tmp_path, steps, algo={"terms": [{"name": "logp_l2", "coef": 0.2, **term}]})


def test_the_term_adds_coef_times_its_token_mean_to_the_objective(tmp_path):
    algo = Algorithm(term_config(tmp_path).algo, max_new_tokens=2)
    plain = Algorithm(toy_run_config(tmp_path / "plain", 2).algo, max_new_tokens=2)
    assert algo.needs_reference and not plain.needs_reference  # read from the term's declared inputs
    mask = torch.ones(2, 2)
    inputs = LossInputs(logp=torch.tensor([[-1.0, -2.0], [-0.5, -1.5]]), old_logp=torch.tensor([[-1.0, -2.0], [-0.5, -1.5]]),
                        advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), mask=mask,
                        ref_logp=torch.tensor([[-1.5, -2.0], [-0.5, -0.5]]))
    with_term, metrics = algo.objective(inputs, AggScale.of(mask))
    without, _ = plain.objective(inputs, AggScale.of(mask))
    # squared gaps 0.25, 0, 0, 1 over 4 tokens: 0.3125; coef 0.2: 0.0625
    assert metrics["logp_l2"] == pytest.approx(0.3125)
    assert float(with_term - without) == pytest.approx(0.0625, abs=1e-7)


def test_a_registered_term_trains_a_tiny_model(tmp_path):
    cfg = term_config(tmp_path, params={"power": 2.0})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    before = [p.detach().clone() for p in stages.model.parameters()]
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["logp_l2"] < 1e-10  # the first update starts at the reference
    assert 0 < steps[1]["logp_l2"] and math.isfinite(steps[1]["logp_l2"])  # one step later the policy moved
    assert any(not torch.equal(a, b) for a, b in zip(before, stages.model.parameters()))


@pytest.mark.parametrize("term, error", [
    ({"params": {"pwr": 2.0}}, "unknown param 'pwr' of objective term 'logp_l2'; did you mean 'power'?"),
    ({"name": "logp_l3"}, "algo.terms[0].name"),
    ({"name": "kl"}, "the 'kl' term is switched on by algo.kl_coef"),
])
def test_listed_terms_are_checked_at_config_time(tmp_path, term, error):
    with pytest.raises(ConfigError) as err:
        term_config(tmp_path, **term)
    assert error in str(err.value)
