"""The scoring rules of the judge rewards, as pure functions of the judge's parsed answers.

Rubric scores (explicit and variance-aware), token F1 for FLIP, EVOLM's generator reward, majority
votes, preference-cycle breaking for RRC, GRRM's ranking and score rewards, and the overlong penalty.
They take plain numbers and strings, so they are tested without a judge (docs/rewards/judges.md);
`lmrl.rewards.judges` asks the judge and applies them.
"""
from __future__ import annotations

import math
import re
import string
from collections import Counter
from dataclasses import dataclass

from lmrl.stats import overlong_fraction

CATEGORY_WEIGHTS = {"essential": 5.0, "important": 3.0, "optional": 1.0, "pitfall": -2.0}

@dataclass
class Criterion:
    text: str
    weight: float  # > 0 for a wanted property; < 0 for a pitfall
    satisfied_is_bad: bool  # pitfalls written as failure descriptions: "met" means triggered


def parse_criteria(items: list) -> list[Criterion]:
    """Criteria from a recipe: strings (weight 1) or {criterion, weight | category, satisfied_is_bad}."""
    if not isinstance(items, list) or not items:
        raise ValueError("criteria must be a non-empty list of strings or {criterion, weight} mappings")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = {"criterion": item}
        text = item.get("criterion", item.get("text")) if isinstance(item, dict) else None
        category = str(item.get("category", "")).lower() if isinstance(item, dict) else ""
        if not isinstance(text, str) or (category and category not in CATEGORY_WEIGHTS):
            raise ValueError(f"criteria[{i}] needs 'criterion' text and an optional category in "
                             f"{sorted(CATEGORY_WEIGHTS)} (got {item!r})")
        weight = float(item.get("weight", CATEGORY_WEIGHTS.get(category, 1.0)))
        if weight == 0:
            raise ValueError(f"criteria[{i}] has weight 0")
        out.append(Criterion(text, weight, bool(item.get("satisfied_is_bad", weight < 0))))
    if not any(c.weight > 0 for c in out):
        raise ValueError("criteria need at least one positive weight")
    return out


def rubric_score(weights: list[float], hits: list[int], variant: str = "explicit",
                 beta: float = 0.5, eta: float = 0.5) -> float:
    """§1.3 rubric rewards from signed weights and hits (1 = met for w > 0, triggered for a pitfall w < 0).

    explicit:   (Σ_pos w·c − Σ_pit |w|·c) / Σ_pos w
    complexity: p·(1 + β ln K), p = Σ w·c / Σ|w|, K = #criteria
    hybrid:     (1 − η)·p + η·1[every positive criterion met]
    """
    if variant == "explicit":
        return sum(w * c for w, c in zip(weights, hits)) / sum(w for w in weights if w > 0)
    p = sum(w * c for w, c in zip(weights, hits)) / sum(abs(w) for w in weights)
    if variant == "complexity":
        return p * (1 + beta * math.log(len(weights)))
    if variant == "hybrid":
        return (1 - eta) * p + eta * float(all(c for w, c in zip(weights, hits) if w > 0))
    raise ValueError(f"unknown rubric variant {variant!r}; use explicit, complexity or hybrid")


def normalise_answer(text: str) -> list[str]:
    """SQuAD-style tokens: lowercase, no punctuation, no articles (a/an/the), whitespace-split."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def token_f1(predicted: str, reference: str) -> float:
    """Multiset token-overlap F1 of the normalised texts (1.0 when both are empty)."""
    p, r = normalise_answer(predicted), normalise_answer(reference)
    if not p or not r:
        return float(p == r)
    overlap = sum((Counter(p) & Counter(r)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(p), overlap / len(r)
    return 2 * precision * recall / (precision + recall)


def evolm_generator_reward(judge_pos: float, judge_neg: float, margin: bool = False) -> float:
    """§1.14: a rubric is rewarded when it ranks the newer response above the older one (or by the margin)."""
    return judge_pos - judge_neg if margin else float(judge_pos > judge_neg)


def majority(votes: list[str]) -> str | None:
    """The most frequent vote; None on a tie for first place."""
    ranked = Counter(votes).most_common()
    return None if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]) else ranked[0][0]


def break_preference_cycles(margin: list[list[float]]) -> list[list[float]]:
    """Remove, in every preference cycle, the edge with the smallest vote margin (it becomes a tie).

    `margin[i][j] > 0` means i beats j by that many votes. lmrl's own rule: RRC's conflict-aware
    adjustment is not published in enough detail to copy.
    """
    m = [row[:] for row in margin]
    n = len(m)

    def find_cycle() -> list[tuple[int, int]] | None:
        state = [0] * n  # 0 new, 1 on stack, 2 done
        stack: list[int] = []

        def visit(u: int) -> list[tuple[int, int]] | None:
            state[u] = 1
            stack.append(u)
            for v in range(n):
                if m[u][v] > 0:
                    if state[v] == 1:
                        path = stack[stack.index(v):] + [v]
                        return list(zip(path, path[1:]))
                    if state[v] == 0 and (cycle := visit(v)):
                        return cycle
            state[u] = 2
            stack.pop()
            return None

        return next((c for s in range(n) if state[s] == 0 and (c := visit(s))), None)

    while (cycle := find_cycle()) is not None:
        i, j = min(cycle, key=lambda e: m[e[0]][e[1]])
        m[i][j] = m[j][i] = 0.0
    return m


def overlong_penalty(length: int, max_length: int, buffer: int, penalty: float) -> float:
    """DAPO-style soft penalty: 0 up to max_length − buffer, then `penalty` × the overlong fraction
    (`lmrl.stats.overlong_fraction`, the shape of DAPO's reward shaping), capped at `penalty`."""
    if buffer <= 0:
        return 0.0
    fraction = overlong_fraction(length, max_length, buffer)
    return 0.0 if fraction <= 0 else penalty * min(1.0, fraction)


def parse_order(order: str) -> dict[str, int]:
    """'A > B = C' → rank per letter (0 best; '=' shares a rank)."""
    ranks, rank = {}, 0
    for tier in order.split(">"):
        for letter in tier.split("="):
            if letter.strip():
                ranks[letter.strip()] = rank
        rank += 1
    return ranks


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def grrm_ranking_reward(pred_order: str, ref_scores: dict[str, float]) -> float:
    """§1.5 RM reward: fraction of pairs whose relation (>, <, =) matches the reference scores."""
    ranks, letters = parse_order(pred_order), sorted(ref_scores)
    pairs = [(a, b) for i, a in enumerate(letters) for b in letters[i + 1:]]
    if not pairs or set(ranks) != set(letters):
        return 0.0
    return sum(_sign(ranks[b] - ranks[a]) == _sign(ref_scores[a] - ref_scores[b]) for a, b in pairs) / len(pairs)


def grrm_score_reward(pred_scores: dict[str, float], ref_scores: dict[str, float]) -> float:
    """§1.5 RM reward: mean over pairs of {0: 1, 1: 0.6, 2: 0.2}[|margin_ref − margin_pred|] (else 0)."""
    letters = sorted(ref_scores)
    pairs = [(a, b) for i, a in enumerate(letters) for b in letters[i + 1:]]
    credit = {0: 1.0, 1: 0.6, 2: 0.2}
    if not pairs or set(pred_scores) != set(letters):
        return 0.0
    return sum(credit.get(round(abs((ref_scores[a] - ref_scores[b]) - (pred_scores[a] - pred_scores[b]))), 0.0)
               for a, b in pairs) / len(pairs)


def grrm_rm_reward(pred_order: str, pred_scores: dict[str, float], ref_scores: dict[str, float]) -> float:
    """§1.5 total RM reward in [0, 2]; 0 when the score line contradicts the ranking line."""
    if grrm_ranking_reward(pred_order, pred_scores) != 1.0:
        return 0.0
    return grrm_ranking_reward(pred_order, ref_scores) + grrm_score_reward(pred_scores, ref_scores)
