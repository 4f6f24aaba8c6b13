"""Translation: chrF (default) or BLEU of the reply against the row's reference translations (sacrebleu),
scaled to [0, 1], with an optional gate on the reply's language and a penalty for copying the source back.

chrF's character n-gram precision already makes padding pay little (a reply of the reference's n-grams
repeated, or of the reference a hundred times over, scores a fraction of the reference itself); what it
does not catch is a reply that copies the source sentence, which shares names, numbers and cognates with
the reference: `copy_penalty` zeroes a reply closer to the source than to the reference. The rules and the
measured numbers: docs/rewards/translation.md.
"""
from __future__ import annotations

from typing import Sequence

from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.shaped import RewardModelScore, language_match
from lmrl.types import Sample

METRICS = ("chrf", "bleu")


def _metric(name: str):
    from sacrebleu.metrics import BLEU, CHRF

    if name not in METRICS:
        raise ValueError(f"translation: metric must be one of {', '.join(METRICS)}, got {name!r}")
    return CHRF() if name == "chrf" else BLEU(effective_order=True)


def _references(row: dict, field: str) -> list[str]:
    refs = row.get(field)
    refs = [refs] if isinstance(refs, str) else refs
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise ValueError(f"translation needs the row's {field!r} field: a reference translation or a non-empty "
                         "list of them (set params.reference_field)")
    return refs


@REWARD_FNS.register("translation", "chrF (or BLEU) of the reply against the row's reference(s), in [0, 1], "
                                    "optionally gated on its language")
class TranslationScore:
    """sentence-level chrF (sacrebleu's defaults: character 6-grams, beta 2) or BLEU (effective order) / 100.

    `copy_penalty` (default on): 0 when the reply's score against the row's `source_field` is above its
    score against the reference. `gate_language`: times `language_match` (py3langid) for the row's target
    language (`lang`, else `row[lang_field]`). `qe_model`: a reference-free quality-estimation model of your
    own, a local sequence-classification directory scoring (question, reply), loaded once; with it the reward
    is the mean of the metric and the model's sigmoid score."""

    def __init__(self, metric: str = "chrf", reference_field: str = "reference", source_field: str = "source",
                 copy_penalty: bool = True, gate_language: bool = False, lang: str | None = None,
                 lang_field: str = "target_lang", languages: Sequence[str] = (), qe_model: str | None = None):
        self.metric = _metric(metric)
        self.reference_field, self.source_field, self.copy_penalty = reference_field, source_field, copy_penalty
        self.gate_language, self.lang, self.lang_field, self.languages = gate_language, lang, lang_field, languages
        self.qe = None if qe_model is None else _load_qe(qe_model)

    def similarity(self, text: str, references: list[str]) -> float:
        """The metric's sentence score of `text` against `references`, in [0, 1]."""
        return min(max(self.metric.sentence_score(text, references).score / 100.0, 0.0), 1.0)

    def __call__(self, sample: Sample) -> float:
        row, reply = sample.row, sample.text.strip()
        references = _references(row, self.reference_field)
        score = self.similarity(reply, references) if reply else 0.0
        if self.copy_penalty and reply:
            source = row.get(self.source_field)
            if not isinstance(source, str) or not source.strip():
                raise ValueError(f"translation: copy_penalty needs the source sentence in the row's "
                                 f"{self.source_field!r} field (set params.source_field, or copy_penalty: false)")
            if self.similarity(reply, [source]) > score:
                sample.info["translation"] = "closer to the source than to the reference"
                return 0.0
        if self.gate_language:
            score *= language_match(sample, lang=self.lang, lang_field=self.lang_field, languages=self.languages)
        if self.qe is not None:
            score = (score + self.qe(sample)) / 2
        return score


def _load_qe(path: str) -> RewardModelScore:
    try:
        return RewardModelScore(path, squash="sigmoid")
    except Exception as err:
        raise ValueError(f"translation: qe_model={path!r} could not be loaded as a quality-estimation model "
                         "(a local directory of a transformers sequence-classification checkpoint with its "
                         f"tokenizer, scoring question and reply): {type(err).__name__}: {err}") from None
