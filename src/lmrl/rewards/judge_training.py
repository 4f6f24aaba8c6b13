"""Rewards that train a judge: the policy of the RL stage is the judge (or the rubric writer) itself.

- `grrm_rm` (§1.5 RM side, stages §5.6): the policy reads a GRRM judge prompt (a row of
  `python -m lmrl.task_files judge_rows`) and replies with an analysis, a `Ranking:` line and a score
  line; the reward is `grrm_rm_reward` against the row's reference scores, which the prompt never
  shows. The reply is read strictly (`parse_ranking`, `parse_letter_scores(exact=True)`): a missing,
  repeated or extra candidate, or a ranking the scores contradict, scores 0 — a judge under
  optimisation must not earn credit by hedging. An unreadable reply scores 0 (never an error: the
  judge learns the format from it) and is counted as `grrm_rm/unparsed`.
- `evolm_generator` (§1.14 generator side, stages §5.7, confidence low): the policy writes a rubric R
  for a row of `python -m lmrl.task_files rubric_rows`; a frozen judge scores the row's newer reply y⁺
  and older reply y⁻ under R, as `judge_self_rubric` does, and the reward is
  `evolm_generator_reward(J(y⁺|R), J(y⁻|R))`. An empty rubric scores 0 without a judge call
  (`evolm_generator/empty_rubric`).
Pipeline and deviations: docs/stages/judges.md.
"""
from __future__ import annotations

from typing import Any

from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.judge_client import JudgeResponseError, parse_letter_scores, parse_ranking, strip_reasoning
from lmrl.rewards.judge_scoring import evolm_generator_reward, grrm_rm_reward
from lmrl.rewards.judges import ImplicitRubricReward
from lmrl.types import Sample


def _count(sample: Sample, name: str, happened: bool) -> None:
    sample.info.setdefault("metrics", {})[name] = float(happened)


def reference_scores(row: dict, field: str) -> dict[str, float]:
    """The row's reference scores {letter: score}, checked: at least two candidates, numbers only."""
    ref = row.get(field)
    letters_and_numbers = isinstance(ref, dict) and all(
        isinstance(k, str) and len(k) == 1 and k.isupper() and type(v) in (int, float) for k, v in ref.items())
    if not letters_and_numbers or len(ref) < 2:
        raise ValueError(f"grrm_rm: the task row's {field!r} must map candidate letters to scores, "
                         f"e.g. {{'A': 9, 'B': 4}} (a row of python -m lmrl.task_files judge_rows); got {ref!r}")
    return {k: float(v) for k, v in ref.items()}


def grrm_reply_reward(reply: str, ref: dict[str, float], max_score: float = 10) -> float | None:
    """`grrm_rm_reward` of a judge reply against `ref`, or None when the reply cannot be read."""
    letters = "".join(sorted(ref))
    try:
        order = parse_ranking(reply, letters)
        scores = parse_letter_scores(reply, letters, 0, max_score, exact=True)
    except JudgeResponseError:
        return None
    return grrm_rm_reward(order, scores, ref)


@REWARD_FNS.register("grrm_rm", "GRRM judge training: ranking + score agreement of the policy's judgement with the "
                     "row's reference scores (0 when unreadable or self-contradicting)")
def grrm_rm(sample: Sample, max_score: float = 10, reference_field: str = "reference_scores") -> float:
    """§1.5 RM reward in [0, 2] of the policy's reply to a judge-rows prompt."""
    reward = grrm_reply_reward(sample.text, reference_scores(sample.row, reference_field), max_score)
    _count(sample, "grrm_rm/unparsed", reward is None)
    return 0.0 if reward is None else reward


@REWARD_FNS.register("evolm_generator", "EVOLM rubric generator: 1 when a frozen judge, given the policy's rubric, "
                     "scores the newer reply above the older one (or the margin)")
class EvolmGeneratorReward(ImplicitRubricReward):
    """§1.14 generator reward 1[J(y⁺|R) > J(y⁻|R)] (`margin`: J(y⁺|R) − J(y⁻|R)), J ∈ [0, 1] from the judge's
    `low`–`high` score. Confidence: low — reconstructed from the abstract."""

    def __init__(self, judge: Any = None, margin: bool = False, low: float = 1, high: float = 10,
                 prompt_field: str = "prompt", chosen_field: str = "chosen", rejected_field: str = "rejected",
                 template: str | None = None):
        super().__init__("(the policy's rubric)", judge, low, high, prompt_field, template)
        self.margin, self.fields = margin, (prompt_field, chosen_field, rejected_field)

    def __call__(self, sample: Sample) -> float:
        missing = [f for f in self.fields if not isinstance(sample.row.get(f), str)]
        if missing:
            raise ValueError(f"evolm_generator: the task row lacks the text field(s) {missing} (a row of "
                             "python -m lmrl.task_files rubric_rows)")
        prompt, newer, older = (sample.row[f] for f in self.fields)
        rubric = strip_reasoning(sample.text)
        _count(sample, "evolm_generator/empty_rubric", not rubric)
        if not rubric:
            return 0.0
        return evolm_generator_reward(self.score(prompt, newer, rubric), self.score(prompt, older, rubric),
                                      self.margin)
