"""GenAC (stages §7.2): a generative critic — a language model that reasons and then writes `Value: v` —
in place of a value head. Confidence: low — reconstructed from the abstract.

- `genac_value` (group component, actor side): the critic (`critic`: judge client options, or a client) sees
  the problem x, the response prefix (empty: the value of the prompt, v(x)) and the K most recent rollouts of
  the same prompt with their outcomes (accuracy verdicts of the component `accuracy`, listed before this one);
  its `Value: v` (mean of `samples` calls) is every sample's value. Give it weight 0 and the `genac` advantage
  estimator reads it: A_i = r_i − v(x). With `delimiter`, the critic also values each reply's prefix at the end of
  every step but the last (`text_step_ends`), recorded in `info["critic_steps"]`: the `mc_step_values` input
  turns them into per-segment advantages A_j = v(s_j) − v(s_{j−1}) (v(s_0) = v(x), v(s_m) = the reward) for
  the `mc_step` estimator or the `mc_step_rewards` shaper. The recent rollouts are kept per prompt in the
  component's state (`reward_state`, saved in checkpoints); an evaluation's groups are scored without being remembered.
- `genac_critic` (per sample, critic side): the policy is the critic, its reply is scored −(v − r̄)² against
  the row's `success_rate` r̄ (the actor group's success rate); an unreadable or out-of-range v gets the
  minimum, −1. Its rows: `python -m lmrl.task_files critic_rows` (`lmrl.data.judge_rows`).
"""
from __future__ import annotations

import re
import threading
from collections import deque
from typing import Any

from lmrl.rewards.compute import GROUP_REWARD_FNS, accuracy_verdict
from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.judge_client import JudgeResponseError, strip_reasoning
from lmrl.rewards.judges import make_judge, prompt_text
from lmrl.types import Sample

# a plain decimal: "0.7", "1", "0.70."; "1e-1" or "0.7.5" is no value (read as 1 or 0.7 it would be wrong)
VALUE = re.compile(r"value\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)(?![\deE]|\.\d)", re.IGNORECASE)
MIN_CRITIC_REWARD = -1.0  # −(v − r̄)² with v, r̄ in [0, 1] is never below −1

CRITIC_PROMPT = (
    "You estimate how likely a solver is to answer a problem correctly.\n\nProblem:\n{problem}\n\n"
    "Response so far:\n{prefix}\n\nRecent attempts of the solver at this problem:\n{recent}\n\n"
    "Reason briefly, then end with 'Value: v', v between 0 and 1, the probability that the solver's "
    "answer is correct.")


def parse_value(text: str) -> float | None:
    """The last `Value: v` of a critic reply with v in [0, 1], else None."""
    found = VALUE.findall(strip_reasoning(text))
    if not found:
        return None
    value = float(found[-1])
    return value if 0.0 <= value <= 1.0 else None


def critic_reward(value: float | None, success_rate: float) -> float:
    """−(v − r̄)²; the minimum reward when v could not be read."""
    return MIN_CRITIC_REWARD if value is None else -(value - success_rate) ** 2


def recent_block(recent: list[tuple[str, bool]], max_chars: int) -> str:
    if not recent:
        return "(none yet)"
    return "\n\n".join(f"Attempt {i + 1} ({'correct' if ok else 'wrong'}):\n{text[-max_chars:]}"
                       for i, (text, ok) in enumerate(recent))


def text_step_ends(text: str, delimiter: str, max_steps: int | None = None) -> list[int]:
    """Where each step of a reply ends (exclusive character positions; the last is len(text)): just after a
    `delimiter` that follows some non-blank text of the step, so blank lines stay with the step they precede; a
    blank tail joins the last step, and with `max_steps` the steps past it join the last one too (the text
    form of `envs.controllers.step_ends`)."""
    ends, start, found = [], 0, text.find(delimiter)
    while found != -1:
        if text[start:found].strip():
            start = found + len(delimiter)
            ends.append(start)
        found = text.find(delimiter, found + len(delimiter))
    if not ends or text[ends[-1]:].strip():
        ends.append(len(text))
    else:
        ends[-1] = len(text)
    if max_steps is not None and len(ends) > max_steps:
        ends = [*ends[: max_steps - 1], len(text)]
    return ends


def critic_prompt(problem: str, prefix: str, recent: list[tuple[str, bool]], max_chars: int = 400,
                  template: str | None = None) -> str:
    """The critic's prompt: problem, response prefix and recent rollouts with outcomes (each cut to its last
    `max_chars` characters)."""
    return (template or CRITIC_PROMPT).format(problem=problem, prefix=prefix or "(empty)",
                                              recent=recent_block(recent, max_chars))


@GROUP_REWARD_FNS.register("genac_value", "GenAC: a generative critic's Value v(x) of the prompt, in context of the K "
                           "recent rollouts of the prompt (weight 0; read by the genac advantage)")
class GenerativeCriticValue:
    """v(x) for every sample of a group (confidence: low — reconstructed from the abstract)."""

    def __init__(self, critic: Any = None, k: int = 4, samples: int = 1, accuracy: str = "answer",
                 max_context_chars: int = 400, prompt_field: str = "question", template: str | None = None,
                 delimiter: str | None = None, max_steps: int | None = 8):
        if k < 0 or samples < 1 or (max_steps is not None and max_steps < 1) or delimiter == "":
            raise ValueError(f"genac_value: need k >= 0, samples >= 1, max_steps >= 1 and a non-empty delimiter "
                             f"(got {k}, {samples}, {max_steps}, {delimiter!r})")
        self.client = make_judge(critic)
        self.k, self.samples, self.accuracy = k, samples, accuracy
        self.max_chars, self.prompt_field, self.template = max_context_chars, prompt_field, template
        self.delimiter, self.max_steps = delimiter, max_steps
        self.recent: dict[str, deque] = {}
        self.held_out = False
        self.lock = threading.Lock()

    def values(self, problem: str, prefixes: list[str]) -> list[float]:
        """The critic's value of each response prefix ("": the prompt's v(x)), the mean of `samples` calls each,
        all asked in one batch."""
        with self.lock:
            recent = list(self.recent.get(problem, ()))
        prompts = [critic_prompt(problem, prefix, recent, self.max_chars, self.template) for prefix in prefixes]
        seeds = [{"seed": i} if self.samples > 1 else {} for i in range(self.samples)]
        replies = self.client.chat_many([[{"role": "user", "content": p}] for p in prompts for _ in seeds],
                                        per_call=seeds * len(prompts))
        values = [parse_value(r) for r in replies]
        if any(v is None for v in values):
            bad = next(r for r, v in zip(replies, values) if v is None)
            raise JudgeResponseError(f"genac_value: no 'Value: v' in [0, 1] in critic reply {bad[:200]!r}")
        n = self.samples
        return [sum(values[i: i + n]) / n for i in range(0, len(values), n)]

    def __call__(self, samples: list[Sample]) -> list[float]:
        outcomes = [accuracy_verdict(s, self.accuracy) for s in samples]
        if all(o is None for o in outcomes):
            raise ValueError(f"genac_value reads the verdicts of the reward component {self.accuracy!r}: list it "
                             "before genac_value in reward.components (or set the `accuracy` param); if it is "
                             "listed first, it failed on every sample of this group")
        problem = prompt_text(samples[0], self.prompt_field)
        ends = [text_step_ends(s.text, self.delimiter, self.max_steps) if self.delimiter else [] for s in samples]
        prefixes = [s.text[:e] for s, own in zip(samples, ends) for e in own[:-1]]
        v, *inner = self.values(problem, ["", *prefixes])
        if self.delimiter:
            for s, own in zip(samples, ends):
                s.info["critic_steps"] = {"char_ends": own, "start": v, "values": inner[: len(own) - 1]}
                inner = inner[len(own) - 1:]
        if not self.held_out and self.k:
            with self.lock:
                memory = self.recent.setdefault(problem, deque(maxlen=self.k))
                memory.extend((s.text, o) for s, o in zip(samples, outcomes) if o is not None)  # graded ones only
        return [v] * len(samples)

    def reward_state(self) -> dict:
        """The recent rollouts per prompt (saved in checkpoints: a resumed run shows the critic the same context)."""
        with self.lock:
            return {"recent": {p: [[t, ok] for t, ok in q] for p, q in self.recent.items()}}

    def load_reward_state(self, state: dict) -> None:
        with self.lock:
            self.recent = {p: deque(((t, bool(ok)) for t, ok in q), maxlen=self.k)
                           for p, q in state["recent"].items()}


@REWARD_FNS.register("genac_critic", "GenAC critic training: -(v - success rate)^2 of the policy's 'Value: v' against "
                     "the row's success_rate (unreadable: -1)")
def genac_critic(sample: Sample, target_field: str = "success_rate") -> float:
    """Critic-side reward (confidence: low — reconstructed from the abstract)."""
    target = sample.row.get(target_field)
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 <= target <= 1:
        raise ValueError(f"genac_critic: the task row's {target_field!r} must be the actor group's success rate in "
                         f"[0, 1] (a row of python -m lmrl.task_files critic_rows); got {target!r}")
    value = parse_value(sample.text)
    sample.info.setdefault("metrics", {})["genac_critic/unparsed"] = float(value is None)
    return critic_reward(value, float(target))

