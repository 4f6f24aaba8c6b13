"""StructPO's refinement term (`structpo_refine`, low confidence): the pairs chosen from a step's stage scores
and the DPO value on them, both by hand; what cannot make a pair."""
from __future__ import annotations

import math

import pytest
import torch

from lmrl.algos.losses import LossInputs
from lmrl.algos.structured_credit import refinement_pairs, structpo_refine
from lmrl.config import ConfigError
from lmrl.loading import build_config, load_recipe

T = torch.tensor


def test_pairs_by_hand():
    # group 0: weakest stages 0.6, 0.3 (stage 0), 0.5 -> original row 1; on stage 0 its peers score 0.8 and 0.5 ->
    # refined row 0. Group 1: both weakest 0.2 on stage 1 -> original row 3 (the earlier); row 4 scores 0.2 there too:
    # no gain, no pair.
    scores = T([[0.8, 0.6], [0.3, 0.9], [0.5, 0.7], [0.9, 0.2], [0.3, 0.2], [0.4, 0.4]])
    group = T([0, 0, 0, 1, 1, 2])  # group 2: a single row
    pair, chosen = refinement_pairs(scores, group)
    assert pair.tolist() == [0, 0, -1, -1, -1, -1] and chosen.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    pair, _ = refinement_pairs(T([[0.8, 0.6], [0.3, 0.9], [0.5, 0.7]]), T([0, 0, 0]), min_gain=0.5)
    assert pair.tolist() == [-1, -1, -1]  # 0.8 - 0.3 = 0.5 is not more than min_gain
    ties = refinement_pairs(T([[0.5, 0.5], [0.5, 0.5]]), T([0, 0]))[0]
    assert ties.tolist() == [-1, -1]  # equal rollouts: nothing was refined


def test_the_term_is_dpo_on_the_pairs_over_the_batch_rows():
    # rows 0 (refined) and 1 (original) pair; rows 2, 3 do not. h = Σ(logπ − logπ_ref): row 0 1.0, row 1 −1.0
    logp = T([[0.5, 0.5], [-0.5, -0.5], [0.3, 0.0], [0.0, 0.0]], requires_grad=True)
    inputs = LossInputs(logp=logp, old_logp=torch.zeros(4, 2), advantages=torch.zeros(4, 2), mask=torch.ones(4, 2),
                        ref_logp=torch.zeros(4, 2),
                        extras={"refine_pair": T([0, 0, -1, -1]), "refine_chosen": T([1.0, 0.0, 0.0, 0.0])})
    per_row, metrics = structpo_refine(inputs, torch.ones(4, 2), beta=0.1)
    want = -math.log(1 / (1 + math.exp(-0.1 * (1.0 - (-1.0)))))  # −log σ(β (h_w − h_l)) = 0.598139
    assert per_row.tolist() == pytest.approx([want, 0.0, 0.0, 0.0], abs=1e-6)
    assert metrics["structpo/refine_pairs"] == 1.0 and metrics["structpo/refine_margin"] == pytest.approx(0.2)
    per_row.sum().backward()  # the gradient raises the refined reply and lowers the original, nothing else
    assert (logp.grad[0] < 0).all() and (logp.grad[1] > 0).all() and (logp.grad[2:] == 0).all()
    none = LossInputs(logp=logp, old_logp=logp, advantages=logp, mask=torch.ones(4, 2), ref_logp=torch.zeros(4, 2),
                      extras={"refine_pair": T([-1, -1, -1, -1]), "refine_chosen": torch.zeros(4)})
    per_row, metrics = structpo_refine(none, torch.ones(4, 2))
    assert per_row.tolist() == [0.0] * 4 and metrics == {"structpo/refine_pairs": 0.0}


def test_the_recipe_wiring_is_checked():
    cfg = load_recipe("structpo", ["algo.terms=[{name: structpo_refine, coef: 0.1, params: {min_gain: 0.1}}]"])
    assert [t.name for t in cfg.algo.terms] == ["structpo_refine"]
    with pytest.raises(ConfigError, match="algo.advantage=structpo"):
        build_config({"algo": {"terms": [{"name": "structpo_refine"}]}})
    with pytest.raises(ConfigError, match="min_gain"):
        load_recipe("structpo", ["algo.terms=[{name: structpo_refine, params: {min_gain: -1}}]"])


def test_the_provider_pairs_the_batch_rows_after_the_stage_scores():
    from test_structpo import STAGES, TOK, batch_of, ids

    from lmrl.config import Config
    from lmrl.inputs.registry import InputContext, provide
    from lmrl.types import Group, Sample

    def reply(intro, body):  # both stages present; the scores are the scorer's
        return Sample([5, 6], ids("<intro>", " cats", "<body>", " dogs"), [0.0] * 4,
                      rewards={"structpo_rules/intro": intro, "structpo_rules/body": body,
                               "structpo_rules/global": 0.5})
    samples = [reply(0.9, 0.2), reply(0.4, 0.8), reply(0.1, 0.9)]  # weakest: 0.2, 0.4, 0.1 -> row 2 on intro
    cfg = Config.model_validate({"algo": {"advantage": "structpo", "advantage_params": {"stages": STAGES},
                                          "terms": [{"name": "structpo_refine", "params": {"min_gain": 0.1}}]}})
    batch = batch_of(samples)
    provide(batch, InputContext(cfg, [Group("g", {}, samples)], requested=frozenset({"refine_pair", "stage_scores"}),
                                step=0, tokenizer=TOK), with_learner=False)
    assert batch.row_extras["refine_pair"].tolist() == [0, -1, 0]  # row 0 is best on intro (0.9 > 0.1 + 0.1)
    assert batch.row_extras["refine_chosen"].tolist() == [1.0, 0.0, 0.0]
