"""TLPO (stages_and_credit.md §7.4): the spec's hand-computed losses, the script language identifier, error
positions, alternatives by greedy continuation, and the token pairs' terms: the mean over error positions, with
gradient on the error positions' tokens only."""
from __future__ import annotations

import math

import pytest
import torch

from lmrl.algos import AggScale, LossInputs
from lmrl.algos.terms import ActiveTerm, compose
from lmrl.algos.token_level import token_dpo_loss, unlikelihood_loss
from lmrl.config import ConfigError
from lmrl.data.token_pairs import TokenPairParams, best_alternative, error_positions, mine_token_pairs
from lmrl.rewards import REWARD_FNS
from lmrl.rewards.language_id import in_script, target_script, text_scripts, token_scripts
from lmrl.types import Group, Sample

T = torch.tensor


class CharTokenizer:
    """Token i is VOCAB[i]; a pair "\\x01" + "\\x02" decodes to one CJK character (a character split over two
    byte-level tokens), either half alone to the replacement character."""

    VOCAB = ["<eos>", " the", " cat", " sat", " кот", " сидит", ".", " ", "\x01", "\x02", "5", " on", "сat", " mat"]
    eos_token_id = 0

    def decode(self, ids):
        text = "".join(self.VOCAB[i] for i in ids if i != 0)
        return text.replace("\x01\x02", "猫").replace("\x01", "\ufffd").replace("\x02", "\ufffd")


TOK = CharTokenizer()


def ids(*words):
    return [CharTokenizer.VOCAB.index(w) for w in words]


# --- the spec's values (§7.4 Test) ----------------------------------------------------------------------------

def test_unlikelihood_of_a_token_with_probability_point_six():
    assert float(unlikelihood_loss(T([math.log(0.6)]))) == pytest.approx(0.9163, abs=5e-5)


def test_token_dpo_at_the_reference_is_log_two():
    lp = T([math.log(0.3)]), T([math.log(0.6)])
    loss, z = token_dpo_loss(lp[0], lp[1], lp[0], lp[1], beta=0.1)
    assert float(loss) == pytest.approx(math.log(2), abs=5e-5) and float(z) == 0.0


def test_token_dpo_margin_and_loss_of_the_spec():
    loss, z = token_dpo_loss(T([math.log(0.3)]), T([math.log(0.6)]), T([math.log(0.2)]), T([math.log(0.7)]), 0.1)
    assert float(z) == pytest.approx(0.5596, abs=5e-5) and float(loss) == pytest.approx(0.6656, abs=5e-5)


# --- the terms on token pairs: mean over E, gradient on the error positions only ------------------------------

def pair_batch(logp_rows, ref_rows, last):
    """Two pairs (rows 0/1 and 2/3), chosen first; each row's loss mask on position `last[row]` only."""
    logp = torch.full((4, 4), -3.0)
    ref = torch.full((4, 4), -2.5)
    mask = torch.zeros(4, 4)
    for r, (t, lp, rp) in enumerate(zip(last, logp_rows, ref_rows)):
        logp[r, t], ref[r, t], mask[r, t] = lp, rp, 1.0
    logp.requires_grad_(True)
    extras = {"pair": T([0, 0, 1, 1]), "chosen": T([1.0, 0.0, 1.0, 0.0])}
    return LossInputs(logp, logp.detach(), torch.zeros(4, 4), mask, ref, extras=extras), mask


def test_dpo_term_on_token_pairs_is_the_mean_token_dpo_and_trains_nothing_else():
    a, e, ra, re = math.log(0.3), math.log(0.6), math.log(0.2), math.log(0.7)
    inputs, mask = pair_batch([a, e, a, e], [a, e, ra, re], last=[2, 2, 1, 1])
    total, metrics = compose([ActiveTerm("dpo", 1.0, {"beta": 0.1})], inputs, mask, AggScale.of(mask), "token_mean")
    assert float(total.detach()) == pytest.approx((math.log(2) + 0.6656) / 2, abs=5e-5)
    total.backward()
    grad = inputs.logp.grad
    assert torch.all(grad[mask == 0] == 0) and torch.all(grad[mask > 0] != 0)


def test_unlikelihood_term_is_the_mean_over_error_positions_on_the_rejected_token_only():
    inputs, mask = pair_batch([math.log(0.3), math.log(0.6), math.log(0.5), math.log(0.2)], [0.0] * 4,
                              last=[3, 3, 0, 0])
    total, metrics = compose([ActiveTerm("unlikelihood", 1.0)], inputs, mask, AggScale.of(mask), "token_mean")
    assert float(total.detach()) == pytest.approx((-math.log(0.4) - math.log(0.8)) / 2, abs=5e-5)
    assert metrics["tlpo/error_prob"] == pytest.approx(0.4)
    total.backward()
    grad = inputs.logp.grad
    rejected = torch.zeros_like(mask)
    rejected[1, 3] = rejected[3, 0] = 1.0
    assert torch.all(grad[rejected == 0] == 0) and torch.all(grad[rejected > 0] > 0)
    # d/dlogp of −log(1 − p) = p / (1 − p), over 2 pairs
    assert float(grad[1, 3]) == pytest.approx(0.6 / 0.4 / 2, rel=1e-4)


def test_unlikelihood_stays_finite_at_probability_one():
    assert math.isfinite(float(unlikelihood_loss(T([0.0]))))


# --- the script identifier ------------------------------------------------------------------------------------

def test_scripts_of_texts_and_languages():
    assert text_scripts("The cat, 42!") == {"latin"} and text_scripts("кот") == {"cyrillic"}
    assert text_scripts("猫") == {"cjk"} and text_scripts(" 3.14 ") == frozenset()
    assert target_script("en") == "latin" and target_script("ru") == "cyrillic" and target_script("cjk") == "cjk"
    with pytest.raises(ValueError, match="knows no language 'xx'"):
        target_script("xx")


def test_a_homoglyph_inside_a_latin_word_makes_it_wrong_language():
    assert in_script("cat", "latin") is True
    assert in_script("сat", "latin") is False  # Cyrillic с
    assert in_script("...", "latin") is None


def test_language_match_reward_with_the_script_identifier_reads_the_row_target():
    fn = REWARD_FNS.get("language_match")
    english = Sample([1], [2], [0.0], text="The cat sat.", row={"target_lang": "en"})
    mixed = Sample([1], [2], [0.0], text="The cat сидит.", row={"target_lang": "en"})
    empty = Sample([1], [2], [0.0], text="  42 ", row={"target_lang": "en"})
    assert [fn(x, identifier="script") for x in (english, mixed, empty)] == [1.0, 0.0, 0.0]


def test_token_scripts_decode_a_split_character_whole():
    scripts = token_scripts(ids(" the", "\x01", "\x02", "."), TOK)
    assert scripts == [{"latin"}, {"cjk"}, {"cjk"}, frozenset()]


# --- error positions --------------------------------------------------------------------------------------------

def test_error_positions_span_start_and_every():
    words = (" the", " cat", " кот", ".", " сидит", " on", " mat", "\x01", "\x02")
    scripts = token_scripts(ids(*words), TOK)
    assert error_positions(scripts, "latin", "span_start") == [2, 7]
    assert error_positions(scripts, "latin", "every") == [2, 4, 7, 8]
    # a reply that opens in the wrong language errs at its first lettered token; neutral tokens never err
    assert error_positions(token_scripts(ids(" ", "5", " кот", " the"), TOK), "latin") == [2]
    assert error_positions(token_scripts(ids(" кот", " сидит"), TOK), "cyrillic") == []


# --- alternatives -------------------------------------------------------------------------------------------------

class ScriptedProbe:
    """Top-k and greedy continuations from tables, recording what it was asked."""

    def __init__(self, top, continuation):
        self.top, self.continuation, self.asked = top, continuation, []

    def top_k(self, prefix, k):
        self.asked.append(list(prefix))
        return self.top[:k]

    def greedy(self, prefixes, m):
        return [self.continuation[p[-1]][:m] for p in prefixes]


def test_best_alternative_skips_the_error_token_and_candidates_that_drift_out_of_language():
    err, cyr, neutral, good = ids(" кот")[0], ids(" сидит")[0], ids(".")[0], ids(" cat")[0]
    probe = ScriptedProbe([(err, -0.2), (cyr, -1.0), (neutral, -1.5), (good, -2.0)],
                          {cyr: ids(" the"), neutral: ids(" "), good: ids(" sat", "сat")})
    assert best_alternative([5, 1], err, probe, TOK, "latin", k=4, m=8) is None  # " cat sat" + homoglyph
    probe.continuation[good] = ids(" sat", ".")
    assert best_alternative([5, 1], err, probe, TOK, "latin", k=4, m=8) == (good, -2.0)
    assert best_alternative([5, 1], err, probe, TOK, "latin", k=3, m=8) is None  # " ." has no letter: no pass


def test_mined_pairs_share_the_prefix_and_train_only_the_last_token():
    completion = ids(" the", " cat", " кот", " on", " mat")
    x = Sample([7, 8], completion, [-0.1, -0.2, -0.3, -0.4, -0.5], policy_version=[3] * 5, reward=1.0,
               row={"target_lang": "en"})
    good = ids(" sat")[0]
    probe = ScriptedProbe([(good, -0.7)], {good: ids(" on", " mat")})
    groups, metrics = mine_token_pairs([Group("g", x.row, [x])], probe, TOK, TokenPairParams())
    assert probe.asked == [[7, 8] + completion[:2]]  # the policy sees the prompt and y_<t
    assert metrics == {"tlpo/error_positions": 1.0, "tlpo/pairs": 1.0, "tlpo/no_alternative": 0.0,
                       "tlpo/over_max_positions": 0.0, "tlpo/rollouts_with_error": 1.0}
    chosen, rejected = groups[0].samples
    assert chosen.completion_ids == completion[:2] + [good] and rejected.completion_ids == completion[:3]
    assert chosen.loss_mask == rejected.loss_mask == [0, 0, 1]
    assert chosen.behaviour_logprobs == [-0.1, -0.2, -0.7] and rejected.behaviour_logprobs == [-0.1, -0.2, -0.3]
    assert (chosen.info["preference"], rejected.info["preference"]) == ("chosen", "rejected")


def test_mining_counts_positions_without_an_alternative_or_past_the_cap_and_needs_a_target():
    x = Sample([7], ids(" кот"), [-0.3], row={})
    probe = ScriptedProbe([(ids(" кот")[0], -0.1)], {})
    with pytest.raises(ValueError, match="batches.params.lang"):
        mine_token_pairs([Group("g", x.row, [x])], probe, TOK, TokenPairParams())
    groups, metrics = mine_token_pairs([Group("g", x.row, [x])], probe, TOK, TokenPairParams(lang="en"))
    assert groups == [] and metrics["tlpo/no_alternative"] == 1.0
    every = Sample([7], ids(" кот", " сидит", " кот"), [-0.3] * 3, row={})
    probe.continuation[ids(" кот")[0]] = []  # at " сидит" the candidate " кот" is Cyrillic too: no pass
    _, metrics = mine_token_pairs([Group("g", {}, [every])], probe, TOK,
                                  TokenPairParams(lang="en", error="every", max_positions=2))
    assert (metrics["tlpo/error_positions"], metrics["tlpo/no_alternative"], metrics["tlpo/over_max_positions"]) \
        == (3.0, 2.0, 1.0)


def test_token_pair_params_are_checked():
    with pytest.raises(ValueError, match="span_start"):
        TokenPairParams(error="words")
    with pytest.raises(ValueError, match=">= 1"):
        TokenPairParams(k=0)
    with pytest.raises(ValueError, match=r"\['K'\]: batches.source=token_pairs reads only"):
        TokenPairParams.of({"K": 3})
    assert TokenPairParams.of({"k": 3, "lang": "ru"}).target({}) == "cyrillic"


def test_token_pairs_source_refuses_the_background_loop_and_unknown_params():
    from lmrl.config import Config
    from lmrl.data.sources import check_batches

    cfg = Config.model_validate({"batches": {"source": "token_pairs"}, "algo": {"terms": [{"name": "unlikelihood"}]},
                                 "rollout": {"group_size": 1, "max_staleness": 1}})
    with pytest.raises(ConfigError, match="rollout.max_staleness"):
        check_batches(cfg)
    inline = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_staleness": None})})
    check_batches(inline)
    typo = inline.model_copy(update={"batches": inline.batches.model_copy(update={"params": {"errors": "every"}})})
    with pytest.raises(ConfigError, match="reads only"):
        check_batches(typo)
