"""CoAct: a self-consistency split between self-labels and the oracle (docs/methods/coact.md).

Per group of K answers, the agreement c is the top vote share (majority-vote answer classes;
a sample without an answer counts as dissent). c ≥ τ_hi: the group is self-labelled with its
majority answer (reward 1 for agreeing samples, as `majority_vote`); c ≤ τ_lo: the oracle labels it
(the task row's gold answer, as `answer`); in between: no verdict. Why: confident groups need no
label, the most uncertain ones get the expensive one, so the share of oracle calls is what CoAct saves.
"""
from __future__ import annotations

from collections import Counter

from lmrl.rewards.compute import GROUP_REWARD_FNS
from lmrl.rewards.functions import answers_match
from lmrl.rewards.group import _no_verdict, answer_classes, sample_answer
from lmrl.types import Sample

def coact_route(agreement: float, tau_hi: float, tau_lo: float) -> str:
    """'self' when agreement ≥ τ_hi, 'oracle' when ≤ τ_lo, else 'skip'."""
    if not 0 <= tau_lo < tau_hi <= 1:
        raise ValueError(f"coact needs 0 <= tau_lo < tau_hi <= 1 (got tau_lo={tau_lo}, tau_hi={tau_hi})")
    return "self" if agreement >= tau_hi else "oracle" if agreement <= tau_lo else "skip"


@GROUP_REWARD_FNS.register("coact", "CoAct: majority-answer self-label where the group agrees (c >= tau_hi), the "
                           "gold answer where it does not (c <= tau_lo), no verdict in between")
def coact(samples: list[Sample], tau_hi: float = 0.75, tau_lo: float = 0.4, pattern: str | None = None,
          fallback: str = "none", compare: str = "match", between: str = "exclude", **_) -> list[float | None]:
    """1 for a sample whose answer matches the group's label (its majority answer, or the gold one).

    Between the thresholds the group gets all None (`between="exclude"`: left out of the update) or
    all 0 (`"zero"`). Each sample's `info["metrics"]` carries `coact/oracle`, `coact/self_label` and
    `coact/agreement`, so the run logs the share of groups sent to the oracle.
    """
    answers = [sample_answer(s, pattern, fallback) for s in samples]
    ids = answer_classes(answers, compare)
    votes = Counter(i for i in ids if i is not None)
    label, count = votes.most_common(1)[0] if votes else (None, 0)
    agreement = count / len(samples)
    route = coact_route(agreement, tau_hi, tau_lo)
    for s in samples:
        s.info["coact"] = {"agreement": agreement, "route": route}
        s.info.setdefault("metrics", {}).update({"coact/oracle": float(route == "oracle"),
                                                 "coact/self_label": float(route == "self"),
                                                 "coact/agreement": agreement})
    if route == "self":
        return [float(i == label) for i in ids]
    if route == "oracle":
        gold = str(samples[0].row["answer"])
        return [float(a is not None and answers_match(a, gold)) for a in answers]
    return _no_verdict(len(samples), between)
