"""StructPO (stages_and_credit.md §7.5): the spec's stage-1 advantages, stage spans and their tokens, the format
penalty, and the rule-based per-stage scorer, which tags alone, repeated tags or tag words cannot make score."""
from __future__ import annotations

import pytest
import torch

from lmrl.algos import ADVANTAGES
from lmrl.algos.structured_credit import struct_advantages
from lmrl.config import Config
from lmrl.inputs.registry import InputContext
from lmrl.inputs.stages import stage_inputs, token_stages
from lmrl.rewards import REWARD_FNS
from lmrl.rewards.stages import stage_spans
from lmrl.stats import group_normalise
from lmrl.types import Batch, Group, Sample

T = torch.tensor
STAGES = ["intro", "body"]


class WordTokenizer:
    """Each token one string of VOCAB."""

    VOCAB = ["<eos>", "<intro>", " cats", " purr", "<body>", " dogs", " bark", " loud", "."]
    eos_token_id = 0

    def decode(self, ids):
        return "".join(self.VOCAB[i] for i in ids if i != 0)


TOK = WordTokenizer()


def ids(*words):
    return [WordTokenizer.VOCAB.index(w) for w in words]


def test_spec_stage_one_advantages_use_the_unbiased_group_std():
    g = T([0, 0, 0])
    assert group_normalise(T([0.8, 0.4, 0.5]), g, 1e-6).tolist() == pytest.approx([1.1209, -0.8006, -0.3203], abs=5e-4)
    assert group_normalise(T([0.6, 0.7, 0.2]), g, 1e-6).tolist() == pytest.approx([0.3780, 0.7559, -1.1339], abs=5e-4)
    stage_tokens = T([[0, 0, 1], [0, 1, 1], [0, 0, -1]])
    stage_scores = T([[0.8, 0.1], [0.4, 0.9], [0.5, 0.5]])
    adv = ADVANTAGES.get("structpo")(torch.zeros(3, 3), g, torch.ones(3, 3), stage_tokens=stage_tokens,
                                     stage_scores=stage_scores, global_scores=T([0.6, 0.7, 0.2]), alpha=0.5)
    assert adv[:, 0].tolist() == pytest.approx([0.7494, -0.0224, -0.7271], abs=5e-4)
    z_body = group_normalise(T([0.1, 0.9, 0.5]), g, 1e-6)
    assert float(adv[1, 2]) == pytest.approx(0.5 * float(z_body[1]) + 0.5 * 0.7559, abs=5e-4)
    assert float(adv[2, 2]) == pytest.approx(0.5 * -1.1339, abs=5e-4)  # outside every stage: the global part only


def test_struct_advantages_are_zero_off_the_mask_and_check_alpha():
    mask = T([[1.0, 0.0], [1.0, 1.0]])
    adv = struct_advantages(T([[0, 0], [0, 0]]), T([[1.0], [0.0]]), T([1.0, 0.0]), T([0, 0]), mask, alpha=1.0)
    assert float(adv[0, 1]) == 0.0 and float(adv[0, 0]) > 0 > float(adv[1, 0])
    with pytest.raises(ValueError, match="alpha"):
        struct_advantages(T([[0]]), T([[1.0]]), T([1.0]), T([0]), T([[1.0]]), alpha=1.5)


def test_stage_spans_well_formed_missing_repeated_and_misordered():
    text = "x<intro> a <body> b"
    assert stage_spans(text, STAGES) == ([(1, 11), (11, 19)], True)
    assert stage_spans("<intro> a", STAGES) == ([(0, 9), None], False)
    assert stage_spans("<body> b <intro> a", STAGES) == ([(9, 18), None], False)  # body after intro is missing
    assert stage_spans("<intro> a <body> b <body> c", STAGES) == ([(0, 27), None], False)


def test_token_stages_follow_the_tags():
    x = Sample([5], ids(" loud", "<intro>", " cats", " purr", "<body>", " dogs", "."), [0.0] * 7)
    stage_of, present, well_formed = token_stages(x, TOK, STAGES)
    assert stage_of == [-1, 0, 0, 0, 1, 1, 1] and present == [True, True] and well_formed


def rules(text, keywords=("cats", "dogs"), min_words=2):
    return REWARD_FNS.get("structpo_rules")(Sample([1], [2], [0.0], text=text, row={"keywords": list(keywords)}),
                                            stages=STAGES, min_words=min_words)


def test_rule_scorer_parts_and_what_cannot_score():
    assert rules("<intro> cats purr <body> dogs bark") == {"intro": 1.0, "body": 1.0, "global": 1.0}
    assert rules("<intro> cats cats cats <body>") == {"intro": 0.5, "body": 0.0, "global": 0.5}  # distinct words
    assert rules("<intro><body><intro><body>") == {"intro": 0.0, "body": 0.0, "global": 0.0}  # repeated tags
    assert rules("<intro> <body>", keywords=("intro", "body")) == {"intro": 0.0, "body": 0.0, "global": 0.0}
    assert rules("cats purr dogs bark") == {"intro": 0.0, "body": 0.0, "global": 1.0}
    with pytest.raises(ValueError, match="keywords"):
        rules("<intro> a", keywords=())


def batch_of(samples):
    n = max(len(x.prompt_ids) + len(x.completion_ids) for x in samples)
    mask = torch.zeros(len(samples), n - 1)
    for r, x in enumerate(samples):
        mask[r, len(x.prompt_ids) - 1: len(x.prompt_ids) - 1 + len(x.completion_ids)] = 1.0
    return Batch(input_ids=torch.zeros(len(samples), n, dtype=torch.long),
                 attention_mask=torch.ones(len(samples), n, dtype=torch.long), completion_mask=mask,
                 behaviour_logprobs=torch.zeros_like(mask), sequence_rewards=torch.zeros(len(samples)),
                 group_index=torch.zeros(len(samples), dtype=torch.long))


def test_provider_zeroes_stages_without_a_span_and_penalises_the_format():
    good = Sample([5, 6], ids("<intro>", " cats", "<body>", " dogs"), [0.0] * 4,
                  rewards={"structpo_rules/intro": 0.9, "structpo_rules/body": 0.8, "structpo_rules/global": 0.7})
    bad = Sample([5, 6], ids(" cats", "<body>", " dogs"), [0.0] * 3,  # no <intro>: a scorer's 0.9 is ignored
                 rewards={"structpo_rules/intro": 0.9, "structpo_rules/body": 0.6, "structpo_rules/global": 0.7})
    cfg = Config.model_validate({"algo": {"advantage": "structpo", "advantage_params": {
        "stages": STAGES, "format_penalty": 0.25}}})
    batch = batch_of([good, bad])
    stage_inputs(batch, InputContext(cfg, [Group("g", {}, [good, bad])], tokenizer=TOK))
    assert batch.row_extras["stage_scores"].flatten().tolist() == pytest.approx([0.9, 0.8, 0.0, 0.6])
    assert batch.row_extras["global_scores"].tolist() == pytest.approx([0.7, 0.45])
    assert batch.extras["stage_tokens"].tolist() == [[-1, 0, 0, 1, 1], [-1, -1, 1, 1, -1]]


def test_provider_names_a_missing_score_part():
    x = Sample([5], ids("<intro>"), [0.0], rewards={"structpo_rules/intro": 1.0})
    cfg = Config.model_validate({"algo": {"advantage": "structpo", "advantage_params": {"stages": ["intro"]}}})
    with pytest.raises(ValueError, match="structpo_rules/global"):
        stage_inputs(batch_of([x]), InputContext(cfg, [Group("g", {}, [x])], tokenizer=TOK))
