"""Translation: chrF (default) or BLEU of the reply against the row's reference translations (sacrebleu),
scaled to [0, 1], with an optional gate on the reply's language and a penalty for copying the source back.

chrF's character n-gram precision already makes padding pay little (a reply of the reference's n-grams
repeated, or of the reference a hundred times over, scores a fraction of the reference itself); what it
does not catch is a reply that copies the source sentence, which shares names, numbers and cognates with
the reference: `copy_penalty` zeroes a reply closer to the source than to the reference. With `qe_models` the
reward is MiLMMT's reference-free rule instead, r = 1[LID(y) = target] · mean_k QE_k(x, y). The rules and the
measured numbers: docs/rewards/translation.md.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.shaped import RewardModelScore, language_match
from lmrl.types import Sample

METRICS = ("chrf", "bleu")
COPY_LIMIT = 0.8  # under `qe_models`, a reply whose chrF against the source is above this is a copy (scores 0)


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
    is the mean of the metric and the model's sigmoid score.

    `qe_models` (MiLMMT, docs/rewards/translation.md): a list of QE models (`QualityEstimate`), each scoring
    (source, reply) on [0, 1]; the reward is then reference-free: 0 for an empty reply, a reply in another
    language than the target (the gate always applies) or, with `copy_penalty`, a reply whose chrF against the
    source is above `COPY_LIMIT`; otherwise the mean of the models' scores."""

    def __init__(self, metric: str = "chrf", reference_field: str = "reference", source_field: str = "source",
                 copy_penalty: bool = True, gate_language: bool = False, lang: str | None = None,
                 lang_field: str = "target_lang", languages: Sequence[str] = (), qe_model: str | None = None,
                 qe_models: Sequence[str | dict[str, Any]] = ()):
        if qe_model is not None and qe_models:
            raise ValueError("translation: set qe_model (the metric averaged with one QE model) or qe_models "
                             "(MiLMMT's reference-free average of QE models), not both")
        self.metric = _metric(metric)
        self.reference_field, self.source_field, self.copy_penalty = reference_field, source_field, copy_penalty
        self.gate_language, self.lang, self.lang_field, self.languages = gate_language, lang, lang_field, languages
        self.qe = None if qe_model is None else _load_qe(qe_model)
        self.qe_models = [QualityEstimate(entry, source_field) for entry in qe_models]

    def similarity(self, text: str, references: list[str]) -> float:
        """The metric's sentence score of `text` against `references`, in [0, 1]."""
        return min(max(self.metric.sentence_score(text, references).score / 100.0, 0.0), 1.0)

    def __call__(self, sample: Sample) -> float:
        if self.qe_models:
            return self.estimated(sample)
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


    def estimated(self, sample: Sample) -> float:
        """MiLMMT's rule: 1[LID(y) = target] · mean_k QE_k(x, y), 0 for an empty reply or a copy of the source."""
        reply = sample.text.strip()
        if not reply or not language_match(sample, lang=self.lang, lang_field=self.lang_field,
                                           languages=self.languages):
            return 0.0
        source = sample.row.get(self.source_field)
        if self.copy_penalty and isinstance(source, str) and source.strip() and \
                self.similarity(reply, [source]) > COPY_LIMIT:
            sample.info["translation"] = "a copy of the source"
            return 0.0
        return sum(qe(sample) for qe in self.qe_models) / len(self.qe_models)


def unit_score(raw: float, bounds: Sequence[float] | None, invert: bool) -> float:
    """A QE model's output on [0, 1]: its sigmoid without `bounds`, else (raw − lo)/(hi − lo) clipped to [0, 1];
    `invert` (an error-type metric, lower is better) takes 1 minus that."""
    if bounds is None:
        score = 1.0 / (1.0 + math.exp(-raw))
    else:
        lo, hi = bounds
        score = min(max((raw - lo) / (hi - lo), 0.0), 1.0)
    return 1.0 - score if invert else score


class QualityEstimate:
    """One QE model of `qe_models`: a path, or `{path, range: [lo, hi], invert}` (`unit_score`), a local
    sequence-classification directory scoring (the row's source, the reply), loaded once."""

    KEYS = ("path", "range", "invert")

    def __init__(self, entry: str | dict[str, Any], source_field: str):
        spec = {"path": entry} if isinstance(entry, str) else dict(entry)
        unknown = sorted(set(spec) - set(self.KEYS))
        if unknown or not isinstance(spec.get("path"), str):
            raise ValueError(f"translation: each of qe_models is a path or {{path, range, invert}}, got {entry!r}")
        bounds = spec.get("range")
        if bounds is not None and (len(bounds) != 2 or not bounds[0] < bounds[1]):
            raise ValueError(f"translation: qe_models range must be [lo, hi] with lo < hi, got {bounds!r}")
        self.bounds, self.invert = bounds, bool(spec.get("invert", False))
        self.model = _load_qe(spec["path"], squash=None, question_field=source_field)

    def __call__(self, sample: Sample) -> float:
        return unit_score(self.model(sample), self.bounds, self.invert)


def _load_qe(path: str, squash: str | None = "sigmoid", question_field: str = "question") -> RewardModelScore:
    try:
        return RewardModelScore(path, squash=squash, question_field=question_field)
    except Exception as err:
        raise ValueError(f"translation: qe_model={path!r} could not be loaded as a quality-estimation model "
                         "(a local directory of a transformers sequence-classification checkpoint with its "
                         f"tokenizer, scoring question and reply): {type(err).__name__}: {err}") from None
