"""Shaped and self-derived rewards: the spec's hand-computed values, detectors, and the model-backed classes."""
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from lmrl.config import RewardComponent, RewardConfig
from lmrl.eval.abstention import (
    abstention_eval_metrics,
    batched_self_cascade,
    cascade,
    cascade_metrics,
    reply_rows,
    self_cascade,
)
from lmrl.models import tiny_llama
from lmrl.rewards import REWARD_FNS, RewardScorer
from lmrl.rewards.language_id import detect_language
from lmrl.rewards.shaped import (
    AnswerSpanConfidence,
    RewardModelScore,
    TrivialityCorrectedReward,
    answer_span_confidence,
    answer_token_positions,
    count_syllables,
    duration_fit,
    edit_reward,
    extract_edits,
    is_abstention,
    reciprocal_error,
    tcer_score,
    ternary_reward,
)
from lmrl.types import Group, Sample


def sample(text, answer="42", row=None, ids=None, logprobs=None):
    ids = ids if ids is not None else [0] * 3
    return Sample(prompt_ids=[1], completion_ids=ids, behaviour_logprobs=logprobs or [0.0] * len(ids),
                  text=text, row={"answer": answer, **(row or {})})


# §1.1 Reinforced Hesitation ----------------------------------------------------------------

def test_ternary_reward_spec_values_and_threshold():
    assert [ternary_reward(o, 2.0) for o in ("correct", "abstain", "wrong")] == [1.0, 0.0, -2.0]
    lam = 2.0
    threshold = lam / (1 + lam)
    assert threshold == pytest.approx(2 / 3)
    for p in (threshold - 0.01, threshold + 0.01):  # answering beats abstaining (0) exactly above the threshold
        expected = p * 1.0 + (1 - p) * -lam
        assert (expected > 0) == (p > threshold)
    with pytest.raises(ValueError, match="unknown outcome"):
        ternary_reward("maybe", 1.0)


@pytest.mark.parametrize("text,expected", [
    ("I don't know.", 0.0),
    ("Hmm. Answer: I do not know", 0.0),
    ("Answer: I DON’T KNOW", 0.0),  # curly apostrophe, upper case
    ("Answer: 42", 1.0),
    ("I don't know at first, but 40 + 2 = 42. Answer: 42", 1.0),  # the final answer decides
    ("Answer: 41", -2.0),
    ("no idea what to say", -2.0),  # neither an answer nor an abstention: wrong
])
def test_abstention_reward(text, expected):
    assert REWARD_FNS.get("abstention")(sample(text), lam=2.0) == expected


def test_abstention_scope_and_phrases():
    text = "I don't know at first. Answer: 42"
    assert not is_abstention(text)
    assert is_abstention(text, scope="text")
    assert REWARD_FNS.get("abstention")(sample("Answer: pass"), phrases=["pass"]) == 0.0
    assert REWARD_FNS.get("abstention")(sample("so it is 42"), fallback="last_number") == 1.0
    with pytest.raises(ValueError, match="lam"):
        REWARD_FNS.get("abstention")(sample("Answer: 1"), lam=-1)
    with pytest.raises(ValueError, match="non-empty"):
        is_abstention("anything", phrases=["i don't know", " "])


def test_cascade_spec_case():
    calls = []

    def model(reply):
        return lambda: calls.append(reply) or reply

    result = cascade([model("Answer: I don't know"), model("Answer: x"), model("Answer: y")])
    assert (result.reply, result.index, result.queries) == ("Answer: x", 1, 2)
    assert calls == ["Answer: I don't know", "Answer: x"]  # the third model is never queried
    none = cascade(["I don't know", "I do not know"])
    assert (none.reply, none.index, none.queries) == (None, None, 2)


def test_self_cascade_resamples_while_abstaining():
    replies = iter(["I don't know", "I don't know", "Answer: 3", "Answer: 4"])
    result = self_cascade(lambda: next(replies), max_attempts=5)
    assert (result.reply, result.queries) == ("Answer: 3", 3)
    replies = iter(["I don't know"] * 5)
    assert self_cascade(lambda: next(replies), max_attempts=2).queries == 2
    with pytest.raises(ValueError):
        self_cascade(lambda: "x", max_attempts=0)


def test_abstention_eval_metrics_spec_case():
    texts = ["Answer: 42"] * 6 + ["Answer: 1"] + ["I don't know"] * 3
    groups = [Group(str(i), {}, [sample(t)]) for i, t in enumerate(texts)]
    m = abstention_eval_metrics(groups, lam=2.0)
    assert m["eval/coverage"] == pytest.approx(0.7)
    assert m["eval/conditional_accuracy"] == pytest.approx(6 / 7)
    assert m["eval/error_rate"] == pytest.approx(0.1)
    assert m["eval/risk_score"] == pytest.approx(0.4)


def test_batched_self_cascade_counts_queries():
    groups = [Group(str(i), {"i": i}, [sample(t)]) for i, t in enumerate(["Answer: 42", "I don't know", "I don't know"])]
    draws = []

    def draw(rows):
        draws.append([r["i"] for r in rows])
        return [sample("Answer: 42" if r["i"] == 1 else "I don't know") for r in rows]

    finals, queries = batched_self_cascade(groups, draw, max_attempts=3)
    assert draws == [[1, 2], [2]]
    assert queries == [1, 2, 3]
    assert [f.text for f in finals] == ["Answer: 42", "Answer: 42", "I don't know"]


def test_cascade_metrics_over_saved_replies():
    conservative = reply_rows([Group("a", {"answer": "42"}, [sample("Answer: I don't know")]),
                               Group("b", {"answer": "42"}, [sample("Answer: 42")]),
                               Group("c", {"answer": "42"}, [sample("I don't know")])])
    assert [r["outcome"] for r in conservative] == ["abstain", "correct", "abstain"]
    bold = reply_rows([Group(u, {}, [sample(t)]) for u, t in (("a", "Answer: 42"), ("b", "Answer: 1"),
                                                              ("c", "Answer: 3"))])
    m = cascade_metrics([conservative, bold], lam=2.0)
    assert m["cascade/avg_queries"] == pytest.approx((2 + 1 + 2) / 3)
    assert m["cascade/coverage"] == 1.0
    assert m["cascade/conditional_accuracy"] == pytest.approx(2 / 3)  # a from the bold model, b kept, c wrong
    assert m["cascade/risk_score"] == pytest.approx((2 - 2.0) / 3)
    with pytest.raises(ValueError, match="uid"):
        cascade_metrics([conservative, [{"uid": "z", "text": "", "outcome": "wrong"}]], lam=1.0)


# §1.8 RLSF answer-span confidence ------------------------------------------------------------

def test_answer_span_confidence_spec_case():
    assert answer_span_confidence([0.90, 0.60], [0.05, 0.30]) == pytest.approx(0.575)


def test_answer_token_positions_and_prob_measure(tokenizer):
    text = "ok answer: 12"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert answer_token_positions(tokenizer, ids) == [11, 12]  # the characters '1' and '2'
    assert answer_token_positions(tokenizer, tokenizer("no marker", add_special_tokens=False)["input_ids"]) == []
    conf = AnswerSpanConfidence.__new__(AnswerSpanConfidence)
    conf.tokenizer, conf.measure, conf.pattern = tokenizer, "prob", None
    logprobs = [0.0] * len(ids)
    logprobs[11], logprobs[12] = math.log(0.5), math.log(0.9)
    assert conf(sample(text, ids=ids, logprobs=logprobs)) == pytest.approx(0.7)
    assert conf(sample("nothing", ids=[5, 6], logprobs=[0.0, 0.0])) == 0.0


def test_answer_confidence_margin_uses_the_frozen_model(tokenizer, tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    conf = AnswerSpanConfidence(tokenizer=str(tmp_path), measure="margin", model=str(tmp_path))
    prompt = tokenizer("q", add_special_tokens=False)["input_ids"]
    ids = tokenizer("answer: 7", add_special_tokens=False)["input_ids"]
    s = Sample(prompt_ids=prompt, completion_ids=ids, behaviour_logprobs=[0.0] * len(ids), text="answer: 7")
    with torch.no_grad():
        probs = torch.softmax(tiny_model(input_ids=torch.tensor([prompt + ids])).logits[0, -2], -1)
    top = probs.topk(2).values
    assert conf(s) == pytest.approx(float(top[0] - top[1]), abs=1e-5)
    with pytest.raises(ValueError, match="model"):
        AnswerSpanConfidence(tokenizer=str(tmp_path), measure="margin")


# §1.7 TCER ---------------------------------------------------------------------------------

def test_tcer_spec_case():
    assert tcer_score([-0.1, -1.0], [-0.1, -3.0], kappa=1.0) == pytest.approx((0 + (1 - math.exp(-3)) * 2) / 2)
    assert tcer_score([-0.1, -1.0], [-0.1, -3.0]) == pytest.approx(0.95, abs=0.001)
    assert tcer_score([], []) == 0.0


def test_tcer_class_matches_a_manual_forward(tokenizer, tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    tcer = TrivialityCorrectedReward(reference=str(tmp_path), kappa=2.0)
    prompt, ids = [3, 4, 5], [6, 7]
    s = Sample(prompt_ids=prompt, completion_ids=ids, behaviour_logprobs=[-0.5, -1.5], text="")
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(input_ids=torch.tensor([prompt + ids])).logits[0], -1)
    ref = [float(logp[2, 6]), float(logp[3, 7])]
    assert tcer(s) == pytest.approx(tcer_score([-0.5, -1.5], ref, 2.0), abs=1e-5)


# §1.9 MiLMMT language gate -------------------------------------------------------------------

def test_language_match():
    fn = REWARD_FNS.get("language_match")
    assert detect_language("Das ist ein kleiner Test auf Deutsch.") == "de"
    assert fn(sample("Das ist ein kleiner Test auf Deutsch."), lang="de") == 1.0
    assert fn(sample("This is an English sentence about the weather."), lang="de") == 0.0
    assert fn(sample("Bonjour, je suis très content.", row={"target_lang": "fr"})) == 1.0
    assert fn(sample("Ciao, come stai oggi?"), lang="it", languages=["it", "en"]) == 1.0
    with pytest.raises(ValueError, match="target_lang"):
        fn(sample("hello"))


# §1.10 Homura --------------------------------------------------------------------------------

def test_duration_fit_spec_case():
    assert duration_fit(1.05, eps=0.1, decay=0.5) == 1.0
    assert duration_fit(1.35, eps=0.1, decay=0.5) == pytest.approx(0.5)
    assert duration_fit(0.65, eps=0.1, decay=0.5) == pytest.approx(0.5)
    assert duration_fit(3.0) == 0.0
    assert duration_fit(1.35, kind="exp") == pytest.approx(math.exp(-0.5))


def test_count_syllables_and_reward():
    assert count_syllables("banana") == 3
    assert count_syllables("make the cake") == 3  # silent final e
    assert count_syllables("你好世界") == 4
    assert count_syllables("hello 世界") == 4
    fn = REWARD_FNS.get("duration_ratio")
    row = {"question": "hello there my friend"}  # 2 + 1 + 1 + 1 = 5 syllables
    assert fn(sample("你好朋友们", row=row)) == 1.0  # 5 / 5
    assert fn(sample("你好", row=row)) == pytest.approx(0.0)  # ρ = 0.4: 0.5 past the band
    assert fn(sample("你好朋友", row={**row, "syllable_ratio": 0.8})) == 1.0  # budget 4


# §1.11 CSRP --------------------------------------------------------------------------------

def test_edit_reward_spec_case():
    e1, e2 = (0, 1, "x"), (3, 4, "y")
    assert edit_reward({e1, e2}, {e1}, lam=0.5) == pytest.approx(0.5556 - 0.25, abs=1e-4)
    assert edit_reward(set(), set()) == 1.0
    assert edit_reward(set(), {e1}) == 0.0
    assert edit_reward({e2}, set(), lam=0.5) == -0.5


def test_edit_efficiency_reward():
    fn = REWARD_FNS.get("edit_efficiency")
    row = {"source": "我门是学生"}
    assert extract_edits("我门是学生", "我们是学生") == {(1, 2, "们")}
    assert fn(sample("我们是学生", answer="我们是学生", row=row)) == pytest.approx(1.0)
    over = fn(sample("我们是好学生", answer="我们是学生", row=row), lam=0.5)
    assert over == pytest.approx(1.25 * 0.5 / (0.25 * 0.5 + 1) - 0.25)
    assert fn(sample("他们是学生", answer="我们是学生", row=row)) < 0.5
    assert fn(sample("the cat sat", answer="the cat sat", row={"source": "the cat sat"}), unit="word") == 1.0


# Reciprocal error, entities, reward model ------------------------------------------------------

def test_reciprocal_error():
    assert reciprocal_error(0.0) == 1.0
    assert reciprocal_error(1.0) == 0.5
    assert reciprocal_error(-3.0) == 0.25
    assert reciprocal_error(2.0, scale=2.0, power=2) == pytest.approx(1 / 3)
    fn = REWARD_FNS.get("reciprocal_error")
    assert fn(sample("Answer: 4.5", answer="5")) == pytest.approx(1 / 1.5)
    assert fn(sample("the weight is 1,002", answer="1000"), scale=2) == 0.5
    assert fn(sample("no number", answer="5")) == 0.0
    with pytest.raises(ValueError):
        reciprocal_error(1.0, scale=0)


def test_entity_match():
    fn = REWARD_FNS.get("entity_match")
    assert fn(sample("It is Mont  Saint-Michel.", answer="mont saint-michel")) == 1.0
    assert fn(sample("It is Mont Saint.", answer="Mont Saint-Michel")) == 0.0
    row = {"entities": ["Lu Xun", "Shaoxing"]}
    assert fn(sample("Lu Xun was born there", row=row)) == 0.0
    assert fn(sample("Lu Xun was born there", row=row), mode="fraction") == 0.5
    assert fn(sample("Paris; Rome", answer="Rome;Paris"), separator=";") == 1.0


def test_reward_model_component(tokenizer, tmp_path):
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    rm = RewardModelScore(path=str(tmp_path))
    s = sample("answer: 7", row={"question": "say 7"})
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "say 7"},
                                         {"role": "assistant", "content": "answer: 7"}], tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        expected = float(rm.model(input_ids=torch.tensor([list(ids)])).logits[0, 0])
    assert rm(s) == pytest.approx(expected)
    squashed = RewardModelScore(path=str(tmp_path), squash="sigmoid")(s)
    assert squashed == pytest.approx(1 / (1 + math.exp(-expected)))
    assert rm(sample("answer: 8", row={"question": "say 7"})) != rm(s)


def test_class_components_build_once_through_the_scorer(tokenizer, tmp_path):
    tiny_llama(vocab_size=len(tokenizer), hidden=32, layers=1, heads=4).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    cfg = RewardConfig(components=[RewardComponent(name="abstention", params={"lam": 1.0}),
                                   RewardComponent(name="tcer", weight=0.0, params={"reference": str(tmp_path)})],
                       accuracy_component="abstention")
    scorer = RewardScorer(cfg)
    group = Group("g", {}, [Sample([3], [6, 7], [-0.5, -0.5], text=t, row={"answer": "7"})
                            for t in ("Answer: 7", "I don't know", "Answer: 8")])
    scorer.score([group])
    assert [s.reward for s in group.samples] == [1.0, 0.0, -1.0]
    assert all("tcer" in s.rewards for s in group.samples)


# §1.15 Sycophancy ----------------------------------------------------------------------------

SYC_ROW = {"baseline_answer": "B", "evidence_answer": "B", "level_answers": ["B", "B"]}


def test_sycophancy_spec_case_and_capitulation():
    fn = REWARD_FNS.get("sycophancy")
    kept = fn(sample("The evidence supports B. Answer: B", answer="B", row=SYC_ROW))
    assert sum(kept.values()) == 4.0
    assert kept["agreement_suppression"] == 0.0 and kept["position_consistency"] == 1.0
    caved = fn(sample("You're right, sorry. Answer: A", answer="B", row=SYC_ROW))
    assert caved == pytest.approx({"pressure_resistance": 0.0, "context_fidelity": 0.0, "position_consistency": 2 / 3,
                                   "agreement_suppression": -1.0, "correctness": 0.0})
    weighted = fn(sample("Answer: B", answer="B"), weights={"correctness": 2.0})
    assert weighted == {"agreement_suppression": 0.0, "correctness": 2.0}  # terms without row fields are left out
    with pytest.raises(ValueError, match="unknown terms"):
        fn(sample("Answer: B"), weights={"honesty": 1.0})


def test_sycophancy_terms_are_logged_and_summed_by_the_scorer():
    cfg = RewardConfig(components=[RewardComponent(name="sycophancy")], accuracy_component="sycophancy")
    group = Group("g", {}, [sample(t, answer="B", row=SYC_ROW) for t in ("Answer: B", "You are right. Answer: A")])
    RewardScorer(cfg).score([group])
    assert [s.reward for s in group.samples] == pytest.approx([4.0, -1 / 3])
    assert group.samples[1].rewards["sycophancy/agreement_suppression"] == -1.0
