"""MINT tactic novelty, a group reward: tactic novelty against a history plus within-response tactic
entropy, min-max normalised per group (spec rewards_data_systems §1.16)."""
from __future__ import annotations

import math
import re
from collections import Counter

from lmrl.rewards.compute import GROUP_REWARD_FNS
from lmrl.types import Sample

TACTIC_KEYWORDS = {  # crude keyword stand-ins for MINT's ten per-tactic LoRA sentence taggers
    "information": r"\b(research|studies|fact|typically|common(ly)?|often)\b",
    "assistance": r"\b(i can help|let me help|i('| a)m here to help|happy to help)\b",
    "advice": r"\b(you (could|should|might)|try|consider|it (may|might) help)\b",
    "validation": r"\b(understandable|makes sense|valid|natural to feel|normal to feel)\b",
    "emotional_expression": r"\b(i('| a)m (so )?sorry|sad to hear|glad|that sounds (hard|tough|difficult))\b",
    "paraphrasing": r"\b(it sounds like|so you('| a)re|what i hear|you feel)\b",
    "self_disclosure": r"\b(i (also|once|too)|when i|i('| ha)ve (been|felt))\b",
    "questioning": r"\?",
    "reappraisal": r"\b(another way|on the other hand|look at it|silver lining|opportunity)\b",
    "empowerment": r"\b(you can do|you('| a)re capable|believe in you|you('| ha)ve got this|strength)\b",
}
TACTIC_LABEL_NAMES = (r"validation|validate|validating|advice|advising|paraphrasing|paraphrase|empowerment|empower"
                      r"|empowering|reappraisal|reappraise|reframing|emotional[_ ]expression|express(?:ing)? emotion"
                      r"|self[_ -]disclosure|self[_ -]disclose|questioning|information|informing|assistance|assisting")
TACTIC_LABEL_PATTERN = (rf"\*\*(?:{TACTIC_LABEL_NAMES})\*\*|\*(?:{TACTIC_LABEL_NAMES})\*|\d+\.\s*\*{{1,2}}(?:{TACTIC_LABEL_NAMES})"
                        rf"|##?#?\s*(?:{TACTIC_LABEL_NAMES})|\((?:{TACTIC_LABEL_NAMES})\)"
                        r"|(?:empathy\s+)?tactics?\s*(?:used|count|so far|in this)|tactics\s*:")


def tactic_counts(text: str, tactics: dict[str, str]) -> Counter:
    """Per tactic, the number of sentences whose text matches its regex (a sentence may carry several)."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    return Counter(name for s in sentences for name, rx in tactics.items() if re.search(rx, s, re.IGNORECASE))


def tactic_kl(current: dict[str, float], history: dict[str, float], names: list[str], alpha: float = 0.1,
              cap: float = 5.0) -> float:
    """KL(current ‖ history) over `names`, both Laplace-smoothed by alpha, capped; 0 for an empty response."""
    if not sum(current.values()):
        return 0.0
    total_c = sum(current.get(t, 0) for t in names) + len(names) * alpha
    total_h = sum(history.get(t, 0) for t in names) + len(names) * alpha
    kl = 0.0
    for t in names:
        q = (current.get(t, 0) + alpha) / total_c
        kl += q * math.log(q / ((history.get(t, 0) + alpha) / total_h))
    return min(kl, cap)


def tactic_entropy(counts: dict[str, float]) -> float:
    """Shannon entropy (nats) of the tactic counts within one response."""
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values() if c > 0) if total else 0.0


def minmax(values: list[float], eps: float = 1e-8) -> list[float]:
    """Per-group min-max normalisation; 0.5 for every value when the range is (almost) zero."""
    lo, hi = min(values), max(values)
    return [(v - lo) / (hi - lo) if hi - lo > eps else 0.5 for v in values]


@GROUP_REWARD_FNS.register("novelty", "MINT: tactic novelty vs a history (KL) + tactic entropy, group min-max normalised")
def novelty(samples: list[Sample], tactics: dict[str, str] | None = None, history: str = "auto",
            history_field: str = "tactic_last_turn_counts", quality_component: str | None = None,
            diversity_weight: float = 1.0, kl_weight: float = 1.0, entropy_weight: float = 1.0, alpha: float = 0.1,
            kl_cap: float = 5.0, length_target: int = 200, label_penalty: float = -2.0,
            label_pattern: str = TACTIC_LABEL_PATTERN, **_) -> list[float]:
    """r = [Q̂ + λ_div(γ_KL·KL̂ + γ_H·Ĥ)] × min(1, length_target / tokens), + label_penalty if labels leak.

    History h: `row` = the previous turn's tactic counts in `row[history_field]` (a dict, or text to
    tag); `group` = the summed counts of the other samples of the group (single-turn adaptation:
    novelty against the siblings); `auto` = `row` when the row has the field, else `group`.
    Q̂ = min-max of an earlier component (`quality_component`); without one, the reward is the
    diversity term alone (MINT's diversity-only mode).
    """
    tactics = tactics or TACTIC_KEYWORDS
    names = list(tactics)
    if history not in ("auto", "row", "group"):
        raise ValueError(f"history must be 'auto', 'row' or 'group', got {history!r}")
    counts = [tactic_counts(s.text, tactics) for s in samples]
    row = samples[0].row if samples else {}
    use_row = history == "row" or (history == "auto" and history_field in row)
    if use_row:
        if history_field not in row:
            raise ValueError(f"novelty: the task row has no {history_field!r} (history='row')")
        past = row[history_field]
        past = tactic_counts(past, tactics) if isinstance(past, str) else {k: v for k, v in past.items() if v is not None}
        histories = [past] * len(samples)
    else:
        total = sum(counts, Counter())
        histories = [total - c for c in counts]
    kl = minmax([tactic_kl(c, h, names, alpha, kl_cap) for c, h in zip(counts, histories)])
    ent = minmax([tactic_entropy(c) for c in counts])
    diversity = [kl_weight * k + entropy_weight * e for k, e in zip(kl, ent)]
    if quality_component is not None:
        raw_q = [s.rewards.get(quality_component) for s in samples]
        if any(q is None for q in raw_q):
            raise ValueError(f"novelty: component {quality_component!r} must be listed before novelty")
        scores = [q + diversity_weight * d for q, d in zip(minmax(raw_q), diversity)]
    else:
        scores = diversity
    out = []
    for s, score in zip(samples, scores):
        score *= min(1.0, length_target / max(s.num_generated, 1))
        if re.search(label_pattern, s.text, re.IGNORECASE):
            score += label_penalty
        out.append(score)
    return out
