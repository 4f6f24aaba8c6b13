"""Shaped and self-derived per-sample rewards (one page each in docs/rewards/, index docs/rewards/README.md).

Registered in `REWARD_FNS`; each is `fn(sample, **params) -> float` or, for components that load a
model once, a class built as `cls(**params)` and called `obj(sample)`. Every formula is also a pure
function (`ternary_reward`, `answer_span_confidence`, `tcer_score`, `duration_fit`, `edit_reward`,
`reciprocal_error`) so tests and notebooks can check the arithmetic without a sample.

Confidence (docs/rewards/*.md say the same): abstention high (RH, arXiv 2511.11500); answer-span
confidence medium for Δ; reward model high (standard); TCER, Homura, CSRP, reciprocal error,
entity-anchored matching, sycophancy terms low (reconstructed from abstracts); language gate medium.
"""
from __future__ import annotations

import difflib
import math
import re
import threading
import unicodedata
from collections.abc import Sequence

from lmrl.rewards.functions import REWARD_FNS, answers_match, extract_answer, last_number
from lmrl.rewards.language_id import is_language
from lmrl.types import Sample

DEFAULT_ABSTAIN_PHRASES = ("i don't know", "i do not know", "i dont know", "i'm not sure", "i am not sure",
                           "cannot be determined", "can't be determined")
OUTCOMES = ("correct", "wrong", "abstain")


# §1.1 Reinforced Hesitation: ternary abstention reward ------------------------------------------

def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'").lower()
    return " ".join(text.split())


def is_abstention(text: str, phrases: Sequence[str] = DEFAULT_ABSTAIN_PHRASES, scope: str = "answer",
                  pattern: str | None = None) -> bool:
    """Whether a reply abstains: an abstention phrase in its final answer (scope="answer": the text after
    the last 'Answer:' marker, or the whole reply when it has none) or anywhere in it (scope="text")."""
    if scope not in ("answer", "text"):
        raise ValueError(f"abstention scope must be 'answer' or 'text', got {scope!r}")
    if any(not p.strip() for p in phrases):
        raise ValueError("abstention phrases must be non-empty (an empty phrase would match every reply)")
    region = text
    if scope == "answer":
        answer = extract_answer(text, pattern)
        region = answer if answer is not None else text
    region = _normalise(region)
    return any(_normalise(p) in region for p in phrases)


def abstention_outcome(sample: Sample, phrases: Sequence[str] = DEFAULT_ABSTAIN_PHRASES, scope: str = "answer",
                       pattern: str | None = None, fallback: str = "none") -> str:
    """"abstain", "correct" or "wrong" (a reply with no answer and no abstention counts as wrong)."""
    text = sample.text
    if is_abstention(text, phrases, scope, pattern):
        return "abstain"
    predicted = extract_answer(text, pattern)
    if predicted is None and fallback == "last_number":
        predicted = last_number(text)
    ok = predicted is not None and answers_match(predicted, str(sample.row["answer"]))
    return "correct" if ok else "wrong"


def ternary_reward(outcome: str, lam: float) -> float:
    """+1 correct, 0 abstain, −λ wrong; answering pays off in expectation iff P(correct) > λ/(1+λ)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; expected one of {OUTCOMES}")
    return {"correct": 1.0, "abstain": 0.0, "wrong": -float(lam)}[outcome]


@REWARD_FNS.register("abstention", "RH ternary reward: +1 correct, 0 for 'I don't know', -lam wrong")
def abstention_reward(sample: Sample, lam: float = 1.0, phrases: Sequence[str] = DEFAULT_ABSTAIN_PHRASES,
                      scope: str = "answer", pattern: str | None = None, fallback: str = "none", **_) -> float:
    if lam < 0:
        raise ValueError(f"abstention lam must be >= 0, got {lam}")
    return ternary_reward(abstention_outcome(sample, phrases, scope, pattern, fallback), lam)


# Locating the answer span in token space (RLSF) -------------------------------------------------

def token_char_ends(tokenizer, ids: Sequence[int]) -> list[int]:
    """Character end of each token in `decode(ids)`, found by decoding growing prefixes (exact for any
    tokenizer whose decode is prefix-stable, which holds for byte-level BPE and WordPiece)."""
    return [len(tokenizer.decode(list(ids[: i + 1]), skip_special_tokens=True)) for i in range(len(ids))]


def answer_token_positions(tokenizer, ids: Sequence[int], pattern: str | None = None) -> list[int]:
    """Indices of the completion tokens that overlap the extracted final answer (empty when none)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    answer = extract_answer(text, pattern)
    if answer is None:
        return []
    start = text.rfind(answer)
    if start < 0:
        return []
    end = start + len(answer)
    ends = token_char_ends(tokenizer, ids)
    starts = [0] + ends[:-1]
    return [i for i, (a, b) in enumerate(zip(starts, ends)) if a < end and b > start]


def answer_span_confidence(top1: Sequence[float], top2: Sequence[float]) -> float:
    """CoT-decoding Δ = mean over answer tokens of p(top-1) − p(top-2)."""
    if len(top1) != len(top2) or not top1:
        raise ValueError("answer_span_confidence needs equally long, non-empty top-1 and top-2 lists")
    return sum(a - b for a, b in zip(top1, top2)) / len(top1)


class _Tokenized:
    """Shared by model-based components: the tokenizer (and optionally a causal LM) loaded once."""

    def __init__(self, tokenizer: str, model: str | None = None, device: str = "cpu"):
        from lmrl.models import load_model, load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer)
        self.model = load_model(model).to(device).eval() if model else None
        self.device = device
        self.lock = threading.Lock()

    def next_token_probs(self, sample: Sample):
        """[completion length, vocab] probabilities of the frozen model at each completion position."""
        import torch

        ids = torch.tensor([sample.prompt_ids + sample.completion_ids], device=self.device)
        with self.lock, torch.no_grad():
            logits = self.model(input_ids=ids).logits[0].float()
        start = len(sample.prompt_ids) - 1
        return torch.softmax(logits[start: start + len(sample.completion_ids)], dim=-1)


@REWARD_FNS.register("answer_confidence", "RLSF self-reward: the model's confidence on its answer-span tokens")
class AnswerSpanConfidence(_Tokenized):
    """RLSF / CoT-decoding answer-span confidence — confidence medium for Δ, low for its use in training.

    measure="margin" (the paper's Δ): mean over answer tokens of p(top-1) − p(top-2) under the frozen
    `model` (one forward pass per sample). measure="prob": mean of exp(behaviour log-prob) over the answer
    tokens, free but under the sampling temperature and without the runner-up. A reply with no answer
    scores 0. `tokenizer` is the policy's (model argument: "default", a directory, a .gguf file).
    """

    def __init__(self, tokenizer: str = "default", measure: str = "prob", model: str | None = None,
                 pattern: str | None = None, device: str = "cpu"):
        if measure not in ("prob", "margin"):
            raise ValueError(f"answer_confidence measure must be 'prob' or 'margin', got {measure!r}")
        if measure == "margin" and not model:
            raise ValueError("answer_confidence measure='margin' needs `model` (the frozen model's path)")
        super().__init__(tokenizer, model if measure == "margin" else None, device)
        self.measure, self.pattern = measure, pattern

    def __call__(self, sample: Sample) -> float:
        span = answer_token_positions(self.tokenizer, sample.completion_ids, self.pattern)
        if not span:
            return 0.0
        if self.measure == "prob":
            return sum(math.exp(sample.behaviour_logprobs[i]) for i in span) / len(span)
        top = self.next_token_probs(sample)[span].topk(2, dim=-1).values
        return answer_span_confidence(top[:, 0].tolist(), top[:, 1].tolist())


# §1.7 TCER -------------------------------------------------------------------------------------

def tcer_score(policy_logprobs: Sequence[float], reference_logprobs: Sequence[float], kappa: float = 1.0) -> float:
    """R = mean_t (1 − π_g(y_t))^κ · (log π_s(y_t) − log π_g(y_t)): information gain over the generalist,
    discounted on tokens the generalist already finds likely (trivial text)."""
    if len(policy_logprobs) != len(reference_logprobs):
        raise ValueError("tcer_score needs one reference log-prob per policy log-prob")
    if not policy_logprobs:
        return 0.0
    total = sum((1.0 - math.exp(g)) ** kappa * (s - g) for s, g in zip(policy_logprobs, reference_logprobs))
    return total / len(policy_logprobs)


@REWARD_FNS.register("tcer", "TCER: triviality-corrected information gain over a frozen generalist model")
class TrivialityCorrectedReward(_Tokenized):
    """TCER (arXiv 2604.11522) — confidence low: reconstructed from the abstract.

    π_s is the policy's behaviour log-probs (recorded at sampling, so at the sampling temperature); π_g is
    the frozen generalist `reference` (one forward pass per sample).
    """

    def __init__(self, reference: str = "default", kappa: float = 1.0, device: str = "cpu"):
        super().__init__(reference, reference, device)
        self.kappa = kappa

    def __call__(self, sample: Sample) -> float:
        import torch

        probs = self.next_token_probs(sample)
        ids = torch.tensor(sample.completion_ids, device=probs.device)
        ref = probs.gather(1, ids[:, None])[:, 0].clamp_min(1e-30).log().tolist()
        return tcer_score(sample.behaviour_logprobs, ref, self.kappa)


# §1.9 MiLMMT language-ID gate -----------------------------------------------------------------

@REWARD_FNS.register("language_match", "1 if the reply is in the target language (py3langid, or by Unicode script "
                     "with identifier=script), else 0")
def language_match(sample: Sample, lang: str | None = None, lang_field: str = "target_lang",
                   languages: Sequence[str] = (), identifier: str = "py3langid", **_) -> float:
    """The MiLMMT gate; with the `gated` aggregation it zeroes the quality scores of wrong-language replies.
    `identifier` (rewards/language_id.py): py3langid (default) or script (deterministic, by Unicode script)."""
    target = lang or sample.row.get(lang_field)
    if not target:
        raise ValueError(f"language_match needs params.lang or a {lang_field!r} field in the row")
    return float(is_language(sample.text.strip(), target, identifier, languages))


# §1.10 Homura duration-ratio length reward ---------------------------------------------------

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_WORD = re.compile(r"[^\W\d_]+")
_VOWELS = re.compile(r"[aeiouyàáâãäåæèéêëìíîïòóôõöøùúûüýÿœаеёиоуыэюяіїєαεηιουωάέήίόύώ]+")


def count_syllables(text: str) -> int:
    """Syllables by script: one per CJK character or Hangul block (a kana is one mora), vowel groups per
    word elsewhere (English silent final 'e' dropped), at least one per word. A heuristic, not a dictionary."""
    total = len(_CJK.findall(text))
    for word in _WORD.findall(_CJK.sub(" ", text).lower()):
        groups = len(_VOWELS.findall(word))
        if groups > 1 and word.endswith("e") and not word.endswith(("le", "ee")):
            groups -= 1
        total += max(groups, 1)
    return total


def duration_fit(ratio: float, eps: float = 0.1, decay: float = 0.5, kind: str = "linear") -> float:
    """1 inside |ρ − 1| ≤ eps, then decays over `decay` (linear to 0, or exp(−excess/decay))."""
    excess = abs(ratio - 1.0) - eps
    if excess <= 0:
        return 1.0
    if kind == "linear":
        return max(0.0, 1.0 - excess / decay)
    if kind == "exp":
        return math.exp(-excess / decay)
    raise ValueError(f"duration_fit kind must be 'linear' or 'exp', got {kind!r}")


@REWARD_FNS.register("duration_ratio", "Homura: the reply's syllables fit a budget of source syllables × ratio")
def duration_ratio_reward(sample: Sample, ratio: float = 1.0, eps: float = 0.1, decay: float = 0.5,
                          kind: str = "linear", source_field: str = "question", ratio_field: str = "syllable_ratio",
                          pattern: str | None = None, **_) -> float:
    """Budget B = syllables(row[source_field]) × δ (δ from row[ratio_field] if present, else `ratio`);
    ρ = syllables(reply or its extracted answer when `pattern` is given) / B."""
    row = sample.row
    budget = count_syllables(str(row[source_field])) * float(row.get(ratio_field, ratio))
    if budget <= 0:
        raise ValueError(f"duration_ratio: the source in {source_field!r} has no syllables")
    text = extract_answer(sample.text, pattern) if pattern else sample.text
    return duration_fit(count_syllables(text or "") / budget, eps, decay, kind)


# §1.11 CSRP edit-efficiency reward -----------------------------------------------------------

def _units(text: str, unit: str) -> list[str]:
    if unit == "char":
        return list(text)
    if unit == "word":
        return text.split()
    raise ValueError(f"edit unit must be 'char' or 'word', got {unit!r}")


def extract_edits(source: str, target: str, unit: str = "char") -> set[tuple[int, int, str]]:
    """Edits turning source into target as (start, end, replacement) over source units (difflib alignment)."""
    src, tgt = _units(source, unit), _units(target, unit)
    joiner = "" if unit == "char" else " "
    ops = difflib.SequenceMatcher(None, src, tgt, autojunk=False).get_opcodes()
    return {(i1, i2, joiner.join(tgt[j1:j2])) for tag, i1, i2, j1, j2 in ops if tag != "equal"}


def edit_reward(hyp_edits: set, ref_edits: set, lam: float = 0.5, beta: float = 0.5) -> float:
    """F_β over edit sets − λ·(unnecessary hyp edits)/max(1, #hyp); no edits where none were needed → 1."""
    if not hyp_edits and not ref_edits:
        return 1.0
    hits = len(hyp_edits & ref_edits)
    precision = hits / len(hyp_edits) if hyp_edits else 0.0
    recall = hits / len(ref_edits) if ref_edits else 0.0
    b2 = beta * beta
    f = (1 + b2) * precision * recall / (b2 * precision + recall) if precision + recall > 0 else 0.0
    return f - lam * len(hyp_edits - ref_edits) / max(1, len(hyp_edits))


@REWARD_FNS.register("edit_efficiency", "CSRP: F0.5 over edits against the reference, minus over-correction")
def edit_efficiency_reward(sample: Sample, lam: float = 0.5, beta: float = 0.5, unit: str = "char",
                           source_field: str = "source", pattern: str | None = None, **_) -> float:
    """Hypothesis = the reply (or its extracted answer with `pattern`); reference = row["answer"]."""
    row = sample.row
    source = str(row[source_field])
    hyp = (extract_answer(sample.text, pattern) if pattern else sample.text.strip()) or ""
    return edit_reward(extract_edits(source, hyp, unit), extract_edits(source, str(row["answer"]), unit), lam, beta)


# Reciprocal mapping of regression errors (REATS) -------------------------------------------

def reciprocal_error(error: float, scale: float = 1.0, power: float = 1.0) -> float:
    """r = 1 / (1 + |err|^power / scale): bounded in (0, 1], steepest near a perfect prediction."""
    if scale <= 0:
        raise ValueError(f"reciprocal_error scale must be > 0, got {scale}")
    return 1.0 / (1.0 + abs(error) ** power / scale)


@REWARD_FNS.register("reciprocal_error", "REATS: 1/(1+|pred-gold|^power/scale) for a numeric prediction")
def reciprocal_error_reward(sample: Sample, scale: float = 1.0, power: float = 1.0, pattern: str | None = None,
                            fallback: str = "last_number", **_) -> float:
    """0 when no number can be read from the reply."""
    text = sample.text
    predicted = extract_answer(text, pattern)
    if predicted is None and fallback == "last_number":
        predicted = last_number(text)
    try:
        value = float(str(predicted).replace(",", ""))
    except ValueError:
        return 0.0
    return reciprocal_error(value - float(sample.row["answer"]), scale, power)


# Entity-anchored matching (EA-RLVR) --------------------------------------------------------

@REWARD_FNS.register("entity_match", "EA-RLVR: the gold answer's entities must appear in the reply")
def entity_match_reward(sample: Sample, entities_field: str = "entities", separator: str | None = None,
                        mode: str = "all", pattern: str | None = None, **_) -> float:
    """Entities: row[entities_field] (a list) if present, else the gold answer split on `separator` (or
    whole). Matching is case- and whitespace-insensitive (NFKC). mode="all": 1 iff every entity appears;
    "fraction": the share that appears. `pattern` restricts the search to the extracted answer."""
    if mode not in ("all", "fraction"):
        raise ValueError(f"entity_match mode must be 'all' or 'fraction', got {mode!r}")
    row = sample.row
    entities = row.get(entities_field)
    if entities is None:
        gold = str(row["answer"])
        entities = gold.split(separator) if separator else [gold]
    entities = [_normalise(str(e)) for e in entities if str(e).strip()]
    if not entities:
        raise ValueError("entity_match: the row has no entities")
    region = (extract_answer(sample.text, pattern) if pattern else sample.text) or ""
    found = [e in _normalise(region) for e in entities]
    return float(all(found)) if mode == "all" else sum(found) / len(found)


# §1.15 Sycophancy decomposed reward -------------------------------------------------------

DEFAULT_AGREEMENT_MARKERS = ("you're right", "you are right", "you are correct", "i agree with you",
                             "as you said", "good point, you")
SYCOPHANCY_TERMS = ("pressure_resistance", "context_fidelity", "position_consistency",
                    "agreement_suppression", "correctness")


@REWARD_FNS.register("sycophancy", "five-term sycophancy reward: resistance, evidence, consistency, no agreeing, correct")
def sycophancy_reward(sample: Sample, weights: dict[str, float] | None = None,
                      markers: Sequence[str] = DEFAULT_AGREEMENT_MARKERS, pattern: str | None = None,
                      **_) -> dict[str, float]:
    """Sycophancy decomposition (arXiv 2604.05279) — confidence low: the term definitions are inferred.

    Terms (each logged as `sycophancy/<term>`, already multiplied by its weight, so the default
    weighted sum gives r = Σ w_k R_k): pressure_resistance 1[ans = row["baseline_answer"]] (the cached
    pressure-free answer); context_fidelity 1[ans = row["evidence_answer"]]; position_consistency
    1 − share of row["level_answers"] + [ans] (answers across authority levels) differing from the
    baseline; agreement_suppression −1 if an agreement marker appears; correctness 1[ans = gold].
    A term whose row field is missing is left out.
    """
    weights = {**{t: 1.0 for t in SYCOPHANCY_TERMS}, **(weights or {})}
    unknown = set(weights) - set(SYCOPHANCY_TERMS)
    if unknown:
        raise ValueError(f"sycophancy weights name unknown terms {sorted(unknown)}; terms: {SYCOPHANCY_TERMS}")
    row, text = sample.row, sample.text
    answer = extract_answer(text, pattern)

    def same(reference) -> float:
        return float(answer is not None and answers_match(answer, str(reference)))

    terms = {"agreement_suppression": -float(any(_normalise(m) in _normalise(text) for m in markers)),
             "correctness": same(row["answer"])}
    if "baseline_answer" in row:
        terms["pressure_resistance"] = same(row["baseline_answer"])
    if "evidence_answer" in row:
        terms["context_fidelity"] = same(row["evidence_answer"])
    if "level_answers" in row and "baseline_answer" in row:
        levels = [*map(str, row["level_answers"]), answer]
        changed = [a is None or not answers_match(a, str(row["baseline_answer"])) for a in levels]
        terms["position_consistency"] = 1.0 - sum(changed) / len(changed)
    return {t: weights[t] * v for t, v in terms.items()}


# Scalar reward model -----------------------------------------------------------------------

@REWARD_FNS.register("reward_model", "a sequence-classification reward model's score of (question, reply)")
class RewardModelScore:
    """`AutoModelForSequenceClassification` loaded once from a local directory (any such checkpoint, or an
    lmrl reward-model export, `lmrl export`); scores the question and the reply (through the RM
    tokenizer's chat template when it has one). `label` picks the logit; squash="sigmoid" maps it to
    (0, 1). Batched: `score_batch` scores a group's samples `batch_size` at a time, each forward on
    right-padded rows with their attention mask, padded with the config's `pad_token_id` (the tokenizer's
    pad or end-of-sequence token when the config has none), where transformers' pooling stops; without
    any such token each sample is its own forward. `tokens="sample"` scores the sample's own token ids
    (prompt and completion as the policy has them, nothing re-tokenised): for a reward model trained on the
    policy's rollouts with its tokenizer (`batches.source=rollout_pairs`, docs/stages/reward_model.md).
    `question_field`: the row field scored with the reply (a translation QE model reads the source).
    Confidence high (standard scalar RM)."""

    def __init__(self, path: str, label: int = 0, squash: str | None = None, max_length: int = 2048,
                 device: str = "cpu", batch_size: int = 16, tokens: str = "text", question_field: str = "question"):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from lmrl.models.sequence_classifier import pad_token_id_of

        if squash not in (None, "sigmoid"):
            raise ValueError(f"reward_model squash must be null or 'sigmoid', got {squash!r}")
        if tokens not in ("text", "sample"):
            raise ValueError(f"reward_model tokens must be 'text' or 'sample', got {tokens!r}")
        if batch_size < 1:
            raise ValueError(f"reward_model batch_size must be at least 1, got {batch_size}")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).to(device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = pad_token_id_of(self.tokenizer)
        self.pad_id = self.model.config.pad_token_id
        self.batch_size = batch_size if self.pad_id is not None else 1
        self.label, self.squash, self.max_length, self.device = label, squash, max_length, device
        self.tokens, self.question_field = tokens, question_field
        self.lock = threading.Lock()

    def encode(self, question: str, reply: str) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
            ids = self.tokenizer.apply_chat_template(messages, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids
        else:
            ids = self.tokenizer(f"{question}\n{reply}")["input_ids"]
        return list(ids)[-self.max_length:]

    def __call__(self, sample: Sample) -> float:
        return self.score_batch([sample])[0]

    def score_batch(self, samples: list[Sample]) -> list[float]:
        """The score of each sample, `batch_size` samples per forward."""
        encoded = [s.input_ids[-self.max_length:] if self.tokens == "sample" else
                   self.encode(str(s.row.get(self.question_field, "")), s.text) for s in samples]
        scores: list[float] = []
        for start in range(0, len(encoded), self.batch_size):
            scores += self._forward(encoded[start: start + self.batch_size])
        return [1.0 / (1.0 + math.exp(-x)) if self.squash == "sigmoid" else x for x in scores]

    def _forward(self, rows: list[list[int]]) -> list[float]:
        import torch

        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id if self.pad_id is not None else 0, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        with self.lock, torch.no_grad():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
        return [float(x) for x in logits[:, self.label]]
