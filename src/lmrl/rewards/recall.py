"""Closed-book knowledge recall (the RL-for-direct-recall study): the reply is the answer itself, zero-shot and
without a chain of thought, paid 1 when it equals one of the row's gold aliases after SQuAD normalisation.
Confidence: medium (the setup is explicit in the paper's abstract; the gate's reasoning words are mine).

The format gate enforces "no CoT": a reply longer than `max_tokens` (its generated tokens, or its words when
those are more), on more than one line, or holding a reasoning word or a think tag scores 0 whatever it says.
Fact-level deduplication of held-out items against training (`overlapping_facts`) and the pre-RL hit-count
split (`hit_split`) are the study's measurement tools. The rules: docs/rewards/recall.md.
"""
from __future__ import annotations

import re

from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.judge_scoring import normalise_answer
from lmrl.types import Sample

MAX_TOKENS = 16
_REASONING = re.compile(r"<\s*/?\s*think\s*>|\b(?:because|since|therefore|thus|hence|let's|let us|i think|step)\b",
                        re.IGNORECASE)
_MARKER = re.compile(r"^\s*(?:final\s+)?answer\s*:\s*", re.IGNORECASE)
HIT_SPLITS = ("h=0", "1-16", ">16")


def normalise(text: str) -> str:
    """SQuAD normalisation: lowercase, punctuation removed, the articles a/an/the removed, whitespace collapsed."""
    return " ".join(normalise_answer(text))


def gold_aliases(row: dict, answer_field: str = "answer", aliases_field: str = "aliases") -> list[str]:
    """The row's gold answer and its aliases (a list, or one string), normalised, empty ones dropped."""
    extra = row.get(aliases_field) or []
    extra = [extra] if isinstance(extra, str) else list(extra)
    golds = [normalise(str(g)) for g in [row.get(answer_field, ""), *extra]]
    return [g for g in golds if g]


def gate(sample: Sample, max_tokens: int = MAX_TOKENS) -> str | None:
    """Why the reply fails the no-reasoning format gate, or None when it passes."""
    text = sample.text.strip()
    length = max(len(sample.completion_ids), len(text.split()))
    if length > max_tokens:
        return f"{length} tokens (at most {max_tokens})"
    if "\n" in text:
        return "more than one line"
    if _REASONING.search(text):
        return "reasoning"
    return None


@REWARD_FNS.register("recall_exact", "closed-book recall: 1 if the short reply (<= 16 tokens, one line, no "
                                     "reasoning) equals a gold alias after SQuAD normalisation")
def recall_exact(sample: Sample, max_tokens: int = MAX_TOKENS, answer_field: str = "answer",
                 aliases_field: str = "aliases") -> float:
    """1 when the reply (an optional leading 'Answer:' dropped) normalises to the gold answer or one of its
    aliases and passes the format gate (`gate`); else 0. Why a reply failed the gate is kept in
    `sample.info["recall_gate"]`."""
    if max_tokens < 1:
        raise ValueError(f"recall_exact: max_tokens must be >= 1, got {max_tokens}")
    golds = gold_aliases(sample.row, answer_field, aliases_field)
    if not golds:
        raise ValueError(f"recall_exact: the row has no gold answer in {answer_field!r} or {aliases_field!r}")
    failed = gate(sample, max_tokens)
    if failed is not None:
        sample.info["recall_gate"] = failed
        return 0.0
    return float(normalise(_MARKER.sub("", sample.text.strip())) in golds)


def _fact_keys(row: dict) -> tuple[tuple[str, str], frozenset[str]]:
    """(subject, relation) and the unordered {subject, answer} of a fact row, normalised."""
    subject, answer = normalise(str(row["subject"])), normalise(str(row["answer"]))
    return (subject, normalise(str(row["relation"]))), frozenset((subject, answer))


def overlapping_facts(train: list[dict], held: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the held-out rows kept, those removed): a held-out fact is removed when its (subject, relation) pair or
    its subject together with its answer entity (in either role) occurs in a training fact. Rows need
    `subject`, `relation` and `answer`."""
    pairs, entities = set(), set()
    for row in train:
        pair, both = _fact_keys(row)
        pairs.add(pair)
        entities.add(both)
    kept, removed = [], []
    for row in held:
        pair, both = _fact_keys(row)
        (removed if pair in pairs or both in entities else kept).append(row)
    return kept, removed


def hit_split(hits: int, samples: int = 128) -> str:
    """The study's split of a fact by its pre-RL hit count h (correct samples out of `samples`): "h=0" (never
    recalled), "1-16" (in the tail) or ">16"."""
    if not 0 <= hits <= samples:
        raise ValueError(f"hit_split: hits must be in [0, {samples}], got {hits}")
    return HIT_SPLITS[0] if hits == 0 else HIT_SPLITS[1] if hits <= 16 else HIT_SPLITS[2]
