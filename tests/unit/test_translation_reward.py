"""translation: chrF / BLEU against the row's references, hand-computed and cross-checked against sacrebleu's
command line; the source copied back, n-gram soup, empty and hundredfold replies do not pay; the language gate
and the QE slot; MiLMMT's language-gated mean of two QE models (by hand with stubs, and two tiny models)."""
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from lmrl.rewards import REWARD_FNS
from lmrl.rewards.translation import TranslationScore, unit_score
from lmrl.types import Sample

SOURCE = "The dog sleeps in the garden under the old tree."
REFERENCE = "Der Hund schläft im Garten unter dem alten Baum."
Translation = REWARD_FNS.get("translation")


def score(text, row=None, **params):
    row = row or {"source": SOURCE, "reference": REFERENCE, "target_lang": "de"}
    s = Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row=row)
    return Translation(**params)(s)


def test_chrf_of_a_small_pair_by_hand():
    # chrF averages precision and recall over the character n-gram orders both sides have (here 1 and 2),
    # then F_beta with beta 2: "ab" vs "abc": P1 = 2/2, R1 = 2/3, P2 = 1/1, R2 = 1/2; P = 1, R = 7/12;
    # F = 5 P R / (4 P + R) = (35/12) / (55/12) = 7/11 (sacrebleu's CLI prints 63.6)
    metric = TranslationScore(copy_penalty=False)
    assert metric.similarity("ab", ["abc"]) == pytest.approx(7 / 11)
    # `sacrebleu ref.txt -i hyp.txt -m chrf -b` prints 42.3 for this pair
    assert metric.similarity("der Hund lief", ["der Hund schläft"]) == pytest.approx(0.423, abs=5e-4)


def test_the_reference_scores_one_and_a_close_translation_most():
    assert score(REFERENCE) == pytest.approx(1.0)
    close = score("Der Hund schläft im Garten unter dem Baum.")
    assert 0.7 < close < 1.0
    assert score(REFERENCE, row={"source": SOURCE, "reference": ["Ein anderer Satz.", REFERENCE]}) == pytest.approx(1.0)


def test_bleu_is_the_other_metric():
    assert score(REFERENCE, metric="bleu") == pytest.approx(1.0)
    assert score("Der Hund schläft im Garten.", metric="bleu") < 0.5
    with pytest.raises(ValueError, match="metric must be one of chrf, bleu"):
        score(REFERENCE, metric="comet")


def test_the_source_copied_back_is_zeroed_by_the_copy_penalty():
    # chrF of the copy against the reference: 0.166 (shared letters, "Garten"/"garden"); against the source 1
    assert score(SOURCE, copy_penalty=False) == pytest.approx(0.1656, abs=1e-3)
    assert score(SOURCE) == 0.0
    # what the penalty does not catch: the source followed by the reference keeps chrF's recall, and with
    # beta 2 the halved precision costs only 17% (0.828 against the reference, 0.820 against the source)
    assert score(SOURCE + " " + REFERENCE) == pytest.approx(0.8277, abs=1e-3)
    with pytest.raises(ValueError, match="copy_penalty needs the source sentence"):
        score(REFERENCE, row={"reference": REFERENCE})
    assert score(REFERENCE, row={"reference": REFERENCE}, copy_penalty=False) == pytest.approx(1.0)


def test_padding_pays_little_by_chrf_precision_alone():
    soup = " ".join(sorted(REFERENCE.rstrip(".").split()) * 20)  # the reference's words, sorted, 20 times
    assert score(soup) == pytest.approx(0.1009, abs=1e-3)
    hundredfold = " ".join([REFERENCE] * 100)
    assert score(hundredfold) == pytest.approx(0.0452, abs=1e-3)
    assert score("") == 0.0 and score("   ") == 0.0


def test_the_language_gate():
    assert score(REFERENCE, gate_language=True) == pytest.approx(1.0)
    french = "Le chien dort dans le jardin sous le vieil arbre."
    assert score(french, copy_penalty=False) > 0.0
    assert score(french, gate_language=True, copy_penalty=False) == 0.0
    assert score(REFERENCE, gate_language=True, lang="fr") == 0.0


def test_a_bad_row_is_a_clear_error():
    for row in [{"source": SOURCE}, {"source": SOURCE, "reference": []}, {"source": SOURCE, "reference": [""]}]:
        with pytest.raises(ValueError, match="needs the row's 'reference' field"):
            score(REFERENCE, row=row)


def test_qe_model_slot_loads_a_model_or_says_what_it_needs(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="qe_model='/no/such/qe' could not be loaded as a quality-estimation model"):
        TranslationScore(qe_model="/no/such/qe")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="could not be loaded"):
        TranslationScore(qe_model=str(tmp_path / "empty"))
    with_qe = TranslationScore(qe_model=str(tiny_model_dir))
    s = Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=REFERENCE,
               row={"question": "Translate: " + SOURCE, "source": SOURCE, "reference": REFERENCE})
    qe = with_qe.qe(s)
    assert 0.0 < qe < 1.0 and with_qe(s) == pytest.approx((1.0 + qe) / 2)


def test_milmmt_rule_by_hand_with_stub_scorers():
    # r = 1[LID(y) = target] · ½(QE1 + QE2): right language, QE 0.8 and 0.6 -> 0.7; wrong language -> 0
    milmmt = TranslationScore()
    milmmt.qe_models = [lambda s: 0.8, lambda s: 0.6]
    row = {"source": SOURCE, "target_lang": "de"}  # no reference: the rule is reference-free
    assert milmmt.estimated(sample(REFERENCE, row)) == pytest.approx(0.7)
    assert milmmt.estimated(sample("Le chien dort dans le jardin sous le vieil arbre.", row)) == 0.0
    assert milmmt.estimated(sample(SOURCE, {**row, "target_lang": "en"})) == 0.0  # a copy in the "right" language
    assert milmmt.estimated(sample("  ", row)) == 0.0


def sample(text, row):
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row=row)


def test_qe_scores_on_a_unit_scale():
    assert unit_score(0.0, None, False) == 0.5  # sigmoid(0)
    assert unit_score(math.log(4), None, True) == pytest.approx(0.2)  # 1 - sigmoid(ln 4) = 1 - 0.8
    # an error metric on [0, 25] (MetricX-type): 5 errors -> 0.2, inverted 0.8; out of range clipped
    assert unit_score(5.0, [0, 25], True) == pytest.approx(0.8)
    assert unit_score(30.0, [0, 25], False) == 1.0 and unit_score(-1.0, [0, 25], True) == 1.0


def test_two_tiny_qe_models_from_disk(tokenizer, tmp_path):
    dirs = []
    for seed in (0, 1):
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=4, num_labels=1,
                             pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(seed)
        LlamaForSequenceClassification(config).save_pretrained(tmp_path / f"qe{seed}")
        tokenizer.save_pretrained(tmp_path / f"qe{seed}")
        dirs.append(str(tmp_path / f"qe{seed}"))
    milmmt = Translation(qe_models=[dirs[0], {"path": dirs[1], "invert": True}], languages=["de", "en", "fr"])
    source, reply = "the dog sleeps in the garden.", "der hund schlaeft im garten."
    row = {"source": source, "target_lang": "de"}

    def logit(path):  # the model's own forward on (source, reply) through the chat template
        model = LlamaForSequenceClassification.from_pretrained(path).eval()
        ids = tokenizer.apply_chat_template([{"role": "user", "content": source},
                                             {"role": "assistant", "content": reply}], tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([list(ids)])).logits[0, 0])

    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = (sigmoid(logit(dirs[0])) + 1 - sigmoid(logit(dirs[1]))) / 2
    assert milmmt(sample(reply, row)) == pytest.approx(expected, abs=1e-5)
    assert milmmt(sample(reply, {**row, "target_lang": "fr"})) == 0.0
    with pytest.raises(ValueError, match="or qe_models .*, not both"):
        Translation(qe_model=dirs[0], qe_models=[dirs[1]])
    with pytest.raises(ValueError, match="each of qe_models is a path or"):
        Translation(qe_models=[{"path": dirs[0], "scale": 2}])
    with pytest.raises(ValueError, match="range must be"):
        Translation(qe_models=[{"path": dirs[0], "range": [1, 0]}])
    with pytest.raises(ValueError, match="could not be loaded"):
        Translation(qe_models=["/no/such/qe"])
