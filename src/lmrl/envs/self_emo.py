"""SELF-EMO (specs tasks_and_roles §C6; confidence LOW, a reconstruction from the abstract): one model as an emotion
recogniser and as a responder, each paid by the other's work.

The task (`self_emo`) ships short utterances in a context, each with its gold set of emotions (`LABELS`). An
episode of the environment `self_emo`: the policy, as the responder, writes the next line of the context so
that it expresses a target set (the row's gold set) without naming it. The recogniser, a role of the run
(`recogniser: {role: NAME}`; `model: policy` makes it the same model, SELF-EMO's setting), is shown the context
and a line and answers `Emotions: a, b`; it is asked twice per episode:

- on the row's own gold line: its reward (`emotion_iou`) is the smoothed IoU of its prediction with the gold set,
  IoU_α(P, G) = (|P∩G| + α)/(|P∪G| + α), α = 1;
- on the responder's line: the responder's reward is IoU_α(target, P) times a fluency gate (between `min_words`
  and `max_words` words, mostly alphabetic). The recogniser learns from this call only when the line enters the
  data flywheel (the responder's reward ≥ `accept`): its row then carries the target as the label set; otherwise
  its reward declines (None, excluded).

`emotion_consistency` is SELF-GRPO's group bonus for the recogniser: +γ·(share of the group's predictions equal to
the group's modal set) for a prediction equal to it. Collusion check (both roles share weights, so they could agree
on a private code): `env/explicit_emotion`, the share of responder lines that name an emotion (`EXPLICIT`), and
`env/gold_iou`, the recogniser's IoU on the gold lines (it must not fall).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from lmrl.config import TaskConfig
from lmrl.envs.emotion_lines import LINES
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.roles import role_client
from lmrl.envs.tasks import TASKS, TaskData
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_FNS

LABELS = ("anger", "disgust", "fear", "joy", "sadness", "surprise")
LABEL_WORD = re.compile(r"\b(" + "|".join(LABELS) + r")\b")
MARKER = re.compile(r"emotions?\s*:", re.IGNORECASE)
EXPLICIT = re.compile(r"\b(joy\w*|happ(?:y|ier|iest|iness)|glad|delight\w*|sad\w*|unhappy|sorrow\w*|ang(?:er|ry|rier)"
                      r"|furious|fear\w*|afraid|scared|frighten\w*|terrified|surprise\w*|shock\w*|astonish\w*"
                      r"|disgust\w*|revolt\w*)\b", re.IGNORECASE)
RESPOND = ("Context: {context}\nWrite the next line of this conversation so that it expresses: {target}. Show it, "
           "do not name the emotions. Reply with the line only.")
RECOGNISE = ("Context: {context}\nLine: {line}\nWhich emotions does the line express? Choose from: {labels}. "
             "Reply as `Emotions: a, b`.")


def smoothed_iou(predicted: set[str], gold: set[str], alpha: float = 1.0) -> float:
    """IoU_α(P, G) = (|P∩G| + α)/(|P∪G| + α)."""
    return (len(predicted & gold) + alpha) / (len(predicted | gold) + alpha)


def parse_labels(text: str) -> set[str] | None:
    """The labels named after the last `Emotions:` of a reply; None without that marker or without any label (an
    unparsable reply, paid 0: smoothing would otherwise pay an empty answer α/(|G| + α))."""
    found = list(MARKER.finditer(text))
    if not found:
        return None
    labels = set(LABEL_WORD.findall(text[found[-1].end():].lower()))
    return labels or None


@REWARD_FNS.register("emotion_iou", "SELF-EMO recogniser: smoothed IoU of its predicted emotions with the row's set")
def emotion_iou(sample, alpha: float = 1.0, **_) -> float | None:
    """IoU_α of the labels the recogniser named with `sample.row["labels"]` (0 for an unparsable reply); None when
    the row has no label set (a generated line that did not enter the flywheel)."""
    gold = sample.row.get("labels")
    if gold is None:
        return None
    predicted = parse_labels(sample.text)
    return 0.0 if predicted is None else smoothed_iou(predicted, set(gold), alpha)


@GROUP_REWARD_FNS.register("emotion_consistency", "SELF-GRPO bonus: γ·(modal share) for predicting the group's mode")
def emotion_consistency(samples, gamma: float = 0.1, **_) -> list[float | None]:
    """+γ·(share of the group's predictions equal to its modal set) for each prediction equal to that set, 0 for the
    others (ties between modes: the first in sorted order); None where the row has no label set."""
    predictions = [parse_labels(s.text) for s in samples]
    counts = Counter(tuple(sorted(p)) for p in predictions if p is not None)
    if not counts:
        return [None if s.row.get("labels") is None else 0.0 for s in samples]
    top = max(counts.values())
    modal = min(k for k, n in counts.items() if n == top)
    bonus = gamma * top / len(samples)
    return [None if s.row.get("labels") is None else bonus * float(p is not None and tuple(sorted(p)) == modal)
            for s, p in zip(samples, predictions)]


@TASKS.register("self_emo", "short lines in context with gold emotion sets (SELF-EMO; env.name: self_emo)")
def self_emo_task(cfg: TaskConfig) -> TaskData:
    rows = [{"uid": f"self_emo-{i}", "question": RESPOND.format(context=context, target=", ".join(labels)),
             "answer": "", "context": context, "line": line, "labels": list(labels)}
            for i, (context, line, labels) in enumerate(LINES)]
    if cfg.num_train + cfg.num_eval > len(rows):
        raise ValueError(f"self_emo: the task has {len(rows)} rows; num_train + num_eval asks for more")
    return TaskData(rows[: cfg.num_train], rows[cfg.num_train: cfg.num_train + cfg.num_eval])


def fluent(line: str, min_words: int, max_words: int) -> bool:
    """The fluency gate: one line of `min_words`..`max_words` words, at least 80% of them alphabetic, and no
    `Emotions:` answer in it (a line written for the recogniser to copy is not a line of the conversation)."""
    words = line.split()
    alphabetic = sum(bool(re.search(r"[a-zA-Z]", w)) for w in words)
    return ("\n" not in line.strip() and not MARKER.search(line) and min_words <= len(words) <= max_words
            and alphabetic >= 0.8 * len(words))


@ENVIRONMENTS.register("self_emo", "SELF-EMO: write a line expressing target emotions; paid by a recogniser role's IoU")
class SelfEmoEnv:
    """One responder turn; the recogniser role is asked about the gold line and about the responder's line."""

    def __init__(self, recogniser: dict[str, str] | None = None, alpha: float = 1.0, accept: float = 0.8,
                 min_words: int = 3, max_words: int = 40):
        if recogniser is None or set(recogniser) != {"role"}:
            raise ValueError(f"self_emo: recogniser must be {{role: NAME}} (a role of the run), got {recogniser!r}")
        self.role, self.alpha, self.accept = recogniser["role"], alpha, accept
        self.min_words, self.max_words = min_words, max_words

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        target = row["labels"]
        text = RESPOND.format(context=row["context"], target=", ".join(target))
        return [{"role": "user", "content": text}], {"row": row, "seed": seed, "target": target}

    def recognise(self, context: str, line: str, seed: int, row: dict[str, Any], group: str) -> set[str] | None:
        prompt = RECOGNISE.format(context=context, line=line, labels=", ".join(LABELS))
        said = role_client(self.role).chat([{"role": "user", "content": prompt}], seed=seed, row=row, group=group)
        return parse_labels(said)

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        row, seed, target = state["row"], state["seed"], set(state["target"])
        gold = self.recognise(row["context"], row["line"], seed * 131 + 1, {"labels": row["labels"], "kind": "gold"},
                              f"{row['uid']}/gold")
        flywheel: dict[str, Any] = {"labels": None, "kind": "generated"}  # labelled below if the line is accepted
        line = reply.strip()
        predicted = self.recognise(row["context"], line, seed * 131 + 2, flywheel, f"{row['uid']}/generated")
        iou = 0.0 if predicted is None else smoothed_iou(target, predicted, self.alpha)
        gate = fluent(line, self.min_words, self.max_words)
        reward = iou * gate
        if reward >= self.accept:
            flywheel["labels"] = sorted(target)
        metrics = {"env/iou": iou, "env/fluent": float(gate), "env/accepted": float(reward >= self.accept),
                   "env/explicit_emotion": float(bool(EXPLICIT.search(line))),
                   "env/gold_iou": 0.0 if gold is None else smoothed_iou(gold, set(row["labels"]), self.alpha)}
        return Step(None, reward, True, {"metrics": metrics})
