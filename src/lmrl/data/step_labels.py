"""Math-Shepherd step labels (stages §3.2; the Monte-Carlo step values V̂(s_k) of §6.2): each step of the
policy's own solutions labelled by how often continuations from its end reach a correct answer, written as a
process-reward-model dataset in TRL's stepwise-supervision format.

    python -m lmrl.task_files steps RECIPE OUT.jsonl [overrides] [--model PATH] [--prompts N] [--solutions 4]
        [--k 4] [--separator '\\n'] [--max-steps S] [--hard]

For each training prompt: `solutions` completions sampled at the recipe's rollout settings (those of
`rollout.prompts_per_step` prompts in one engine call); each completion's token ids cut into steps where a
separator's text is completed (`step_ends`); from the end of every step but the last, `k` continuations of the
exact token prefix (prompt ids + completion ids up to there, never re-tokenised text), all of a prompt's
prefixes in one engine call, each within what the rollout budget leaves after its prefix; each full reply
(prefix + continuation) graded by the run's accuracy component alone (`reward.accuracy_component`). A step's
label is `step_label` of the outcomes its grader gave a verdict on; the last step's is the solution's own
outcome; a solution with a step of no verdict at all makes no row. A row: {"prompt", "completions", "labels"}
(the steps without their separator, so prompt + Σ (step + separator) is the reply) plus `outcomes`,
`step_tokens`, `source`, `uid`, `solution` (its index) and `finish_reason`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from lmrl.config import RewardConfig
from lmrl.engines import SamplingParams, sampling_params
from lmrl.errors import ConfigError
from lmrl.envs import rollout
from lmrl.envs.controllers import step_ends
from lmrl.models.steps import bare_step
from lmrl.rewards import RewardScorer
from lmrl.rewards.compute import accuracy_verdict, grader_only
from lmrl.types import Group, Sample


def step_label(outcomes: Sequence[float], hard: bool = False) -> float:
    """A step's Math-Shepherd label from the outcomes (1 correct, 0 not) of the continuations from its end: their
    mean, V̂(s_k) (soft), or 1 when any is correct (`hard`). [1, 1, 0, 1] → 0.75 soft, 1.0 hard."""
    if not outcomes:
        raise ValueError("a step label needs at least one outcome")
    return float(any(o >= 1 for o in outcomes)) if hard else sum(outcomes) / len(outcomes)


def continue_prefixes(engine, tokenizer, row: dict, solutions: list[Sample], prefixes: list[tuple[int, int]],
                      k: int, params: SamplingParams, generator=None) -> list[Group]:
    """For each (solution index, step end) of `prefixes`, `k` continuations of prompt ids + that solution's
    completion ids up to the end, in one engine call, as a Group of full replies (prefix + continuation) each cut
    to the `params.max_new_tokens` budget the solution had (a cut reply's finish reason: "length")."""
    if not prefixes:
        return []
    budget = params.max_new_tokens
    heads = [solutions[i].completion_ids[:end] for i, end in prefixes]
    longest = replace(params, max_new_tokens=budget - min(end for _, end in prefixes))
    outs = engine.generate([list(row["prompt_ids"]) + head for head in heads], k, longest, generator)
    groups = []
    for (i, end), head, completions in zip(prefixes, heads, outs):
        room, solution = budget - end, solutions[i]
        samples = []
        for c in completions:
            ids = head + c.token_ids[:room]
            samples.append(Sample(
                prompt_ids=list(row["prompt_ids"]), completion_ids=ids,
                behaviour_logprobs=solution.behaviour_logprobs[:end] + c.logprobs[:room],
                finish_reason="length" if len(c.token_ids) > room else c.finish_reason,
                policy_version=solution.policy_version[:end] + c.policy_version[:room],
                text=tokenizer.decode(ids, skip_special_tokens=True), row=row))
        groups.append(Group(uid=f"{row['uid']}#{i}@{end}", row=row, samples=samples))
    return groups


@dataclass
class StepLabels:
    """What `label_steps` wrote: the rows, and what it could not label, with the time it took."""

    rows: list[dict] = field(default_factory=list)
    no_verdict: int = 0  # graded replies the grader gave no verdict on (it erred, or returned None)
    left_out: int = 0  # solutions with a step (or an outcome) no reply of which got a verdict: no row
    seconds: float = 0.0

    def summary(self) -> str:
        labels = [x for r in self.rows for x in r["labels"]]
        mean = sum(labels) / len(labels) if labels else float("nan")
        missing = (f"; {self.no_verdict} replies without a verdict, {self.left_out} solutions left out"
                   if self.no_verdict or self.left_out else "")
        return (f"{len(self.rows)} rows, {len(labels)} steps, mean label {mean:.4f}, "
                f"{self.seconds:.1f}s{missing}")


def step_grader(cfg) -> RewardConfig:
    """The reward config that grades a reply: the run's accuracy component alone. A ConfigError for a config
    whose replies are not one completion of the prompt (an environment's episodes) or that names no grader."""
    if cfg.env.name is not None:
        raise ConfigError(f"env.name={cfg.env.name!r}: step labels are for single-turn tasks, whose reply is one "
                          "completion of the prompt")
    return grader_only(cfg.reward)


def label_steps(cfg, rows: list[dict], engine, tokenizer, solutions: int = 4, k: int = 4, separator: str = "\n",
                max_steps: int | None = None, hard: bool = False, generator=None,
                report: Callable[[str], None] | None = None,
                advance: Callable[[int], None] | None = None) -> StepLabels:
    """Math-Shepherd rows for `rows` (encoded training rows) from the policy behind `engine` (module docstring).

    `report`: where the grader's first problem is shown (default stderr); `advance(1)` after each prompt."""
    if solutions < 1 or k < 1 or (max_steps is not None and max_steps < 1):
        raise ValueError("solutions, k and max_steps must be >= 1")
    if not separator:
        raise ValueError("the step separator must not be empty")
    unasked = next((row for row in rows if "question" not in row), None)
    if unasked is not None:
        raise ValueError(f"row {unasked.get('uid', '?')} has no 'question' field: a step-label row holds the task's "
                         "question, which the process reward model reads beside the steps")
    started = time.perf_counter()
    params, component = sampling_params(cfg), cfg.reward.accuracy_component
    scorer = RewardScorer(step_grader(cfg), report)
    out = StepLabels()

    def outcomes(group: Group) -> list[float | None]:
        verdicts = [accuracy_verdict(s, component) for s in group.samples]
        out.no_verdict += sum(v is None for v in verdicts)
        return [None if v is None else float(v) for v in verdicts]

    def label(group: Group) -> None:
        cuts = [step_ends(s.completion_ids, tokenizer, separator, max_steps) for s in group.samples]
        prefixes = [(i, end) for i, ends in enumerate(cuts) for end in ends[:-1]]
        continued = continue_prefixes(engine, tokenizer, group.row, group.samples, prefixes, k, params, generator)
        scorer.score(continued)
        by_prefix = dict(zip(prefixes, (outcomes(g) for g in continued)))
        for i, (solution, own) in enumerate(zip(group.samples, outcomes(group))):
            steps = [by_prefix[(i, end)] for end in cuts[i][:-1]] + [[own]]
            known = [[o for o in step if o is not None] for step in steps]
            if not all(known):
                out.left_out += 1
                continue
            labels = [step_label(o, hard) for o in known]
            out.rows.append(solution_row(group.row, i, solution, cuts[i], tokenizer, separator, steps, labels,
                                         cfg.model.path))
        if advance is not None:
            advance(1)

    chunk = cfg.rollout.prompts_per_step
    for start in range(0, len(rows), chunk):
        groups = rollout(engine, tokenizer, rows[start: start + chunk], solutions, params, generator)
        scorer.score(groups)
        for group in groups:
            label(group)
    out.seconds = time.perf_counter() - started
    return out


def solution_row(row: dict, index: int, solution: Sample, ends: list[int], tokenizer, separator: str,
                 outcomes: list[list[float | None]], labels: list[float], source: str) -> dict:
    """Solution `index` of `row` as a stepwise-supervision row: the task's question (what a process reward
    model reads beside the steps, in training and as the `process_reward_model` reward), its steps' texts
    (without the separators around them) and labels, and where they came from (`rendered_prompt`: the prompt as
    the policy saw it, chat template included)."""
    starts = [0, *ends[:-1]]
    ids = solution.completion_ids
    texts = [bare_step(tokenizer.decode(ids[a:b], skip_special_tokens=True), separator) for a, b in zip(starts, ends)]
    return {"prompt": str(row["question"]), "completions": texts,
            "rendered_prompt": tokenizer.decode(row["prompt_ids"], skip_special_tokens=False),
            "labels": labels, "outcomes": outcomes, "step_tokens": [b - a for a, b in zip(starts, ends)],
            "source": source, "uid": row["uid"], "solution": index, "finish_reason": solution.finish_reason}
