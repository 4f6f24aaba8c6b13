"""StructPO's stage layout of a reply, and a rule-based per-stage scorer that runs offline.

StructPO (docs/methods/structpo.md) — confidence: low — reconstructed from the abstract. A reply is written
in stages marked by reserved tags: `<background> … <gap> … <method> … <contributions> …` for
`stages: [background, gap, method, contributions]`. Stage k's text runs from its tag to the next tag
(`stage_spans`). The layout is well formed when every tag occurs exactly once and in the listed order; a
stage whose tag is missing, repeated or out of order has no span (its score is 0 whatever a scorer says,
and the advantage estimator adds a format penalty to the global score: `inputs.stages`).

`structpo_rules` is a stand-in for per-stage judges, so a recipe runs offline: stage k scores the share of
`min_words` distinct words its span holds (capped at 1), the global score the share of the row's
`keywords` the whole reply mentions. It returns named parts (`structpo_rules/background`, …,
`structpo_rules/global`), which is what the `structpo` estimator reads; any other component returning
those parts (a judge per stage with its rubric) can take its place (`scores_from`).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample

DEFAULT_STAGES = ("background", "gap", "method", "contributions")
_WORD = re.compile(r"[^\W\d_]+")


def stage_tag(name: str) -> str:
    return f"<{name}>"


def stage_spans(text: str, stages: Sequence[str] = DEFAULT_STAGES) -> tuple[list[tuple[int, int] | None], bool]:
    """([(start, end) character span of each stage or None], whether the layout is well formed).

    A stage has a span when its tag occurs exactly once and after the tags of the stages before it that have
    one; the span runs from its tag to the next such tag (the last one to the end of the text)."""
    found = [[m.start() for m in re.finditer(re.escape(stage_tag(s)), text)] for s in stages]
    starts: list[int | None] = []
    last = -1
    for positions in found:
        if len(positions) == 1 and positions[0] > last:
            starts.append(positions[0])
            last = positions[0]
        else:
            starts.append(None)
    present = sorted(p for p in starts if p is not None)
    ends = {p: (present[i + 1] if i + 1 < len(present) else len(text)) for i, p in enumerate(present)}
    spans = [None if p is None else (p, ends[p]) for p in starts]
    return spans, all(p is not None for p in starts)


def stage_text(text: str, span: tuple[int, int] | None, name: str) -> str:
    """A stage's text without its tag ("" when the stage has no span)."""
    return "" if span is None else text[span[0] + len(stage_tag(name)): span[1]]


def distinct_words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


@REWARD_FNS.register("structpo_rules", "StructPO's rule-based stand-in for per-stage judges: each stage's share of "
                     "min_words distinct words, and the share of the row's keywords the reply mentions (global)")
def structpo_rules(sample: Sample, stages: Sequence[str] = DEFAULT_STAGES, min_words: int = 12,
                   keywords_field: str = "keywords", **_) -> dict[str, float]:
    """Named parts: one per stage, each in [0, 1] (0 without a span), and `global` in [0, 1]. Tags are markup, not
    words: neither a stage's words nor the keywords count them."""
    if min_words < 1:
        raise ValueError(f"structpo_rules: min_words must be >= 1 (got {min_words})")
    keywords = sample.row.get(keywords_field)
    if not keywords:
        raise ValueError(f"structpo_rules needs a {keywords_field!r} list in the task row (params.keywords_field)")
    text = sample.text
    spans, _ = stage_spans(text, stages)

    def content(part: str) -> set[str]:
        for s in stages:
            part = part.replace(stage_tag(s), " ")
        return distinct_words(part)

    parts = {name: min(1.0, len(content(stage_text(text, span, name))) / min_words)
             for name, span in zip(stages, spans)}
    mentioned = content(text)
    parts["global"] = sum(str(k).lower() in mentioned for k in keywords) / len(keywords)
    return parts
