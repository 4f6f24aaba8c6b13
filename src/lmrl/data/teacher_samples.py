"""A teacher's completions of a task's training prompts, written as an SFT dataset: sequence-level knowledge
distillation (Kim & Rush 2016; TRL `GKDConfig(seq_kd=True)`, where the teacher generates the completions the
student is trained on), optionally filtered by the task's reward (rejection sampling).

    python -m lmrl.task_files teacher_samples RECIPE OUT.jsonl --model TEACHER [--samples 1] [--rows N]
        [--greedy] [--min-reward R] [--drop-truncated] [overrides]

For each training row: `samples` completions sampled by the teacher at the recipe's rollout settings (those of
`rollout.prompts_per_step` prompts in one engine call; `greedy`: the most likely token at every position). A
written row is TRL's conversational prompt-completion format: `prompt`, the exact chat the row's prompt ids were
rendered from (the task's system prompt included), and `completion`, one assistant message holding the teacher's
decoded text; plus `uid`, `sample` (its index), `finish_reason`, `teacher` and, when scored, `reward`. With
`min_reward` each completion is scored by the recipe's reward components and kept only when its reward is at least
that (an excluded or unscored one is dropped).

This is a text dataset, like every offline dataset: the SFT source (`batches.source: sft`) renders the prompt
through the chat template, which gives the rollout's prompt ids, and tokenises the completion text once, closed by
the template's end of turn. Those are the teacher's token ids wherever decoding and re-encoding round-trip (a
tokenizer may encode a decoded text differently, and special tokens sampled mid-text are dropped); a completion cut
at `rollout.max_new_tokens` gains an end of turn, which `drop_truncated` avoids by leaving such completions out.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from lmrl.engines import sampling_params
from lmrl.envs import rollout
from lmrl.envs.single_turn import prompt_messages
from lmrl.errors import ConfigError
from lmrl.rewards import RewardScorer
from lmrl.types import Group, Sample

BELOW_MIN_REWARD = "scored below --min-reward"
UNSCORED = "had no reward (excluded by the scorer)"
TRUNCATED = "were cut at rollout.max_new_tokens"


@dataclass
class TeacherSamples:
    """What `teacher_rows` wrote, and the completions it left out, by reason."""

    rows: list[dict] = field(default_factory=list)
    left_out: Counter = field(default_factory=Counter)
    sampled: int = 0

    def summary(self) -> str:
        dropped = "; ".join(f"{n} {why}" for why, n in sorted(self.left_out.items()))
        return f"{len(self.rows)} of {self.sampled} teacher completions" + (f" ({dropped}, left out)" if dropped else "")


def check_teacher_config(cfg, samples: int, greedy: bool) -> None:
    """A ConfigError for what `teacher_rows` cannot write: an environment's episodes (not one completion of the
    prompt), or several greedy completions of a prompt (each would be the same)."""
    if cfg.env.name is not None:
        raise ConfigError(f"env.name={cfg.env.name!r}: teacher samples are for single-turn tasks, whose reply is one "
                          "completion of the prompt")
    if samples < 1:
        raise ConfigError("samples must be >= 1")
    if greedy and samples > 1:
        raise ConfigError(f"greedy decoding gives the same completion every time: {samples} samples per prompt "
                          "would repeat it (use 1, or sample at rollout.temperature)")


def sample_row(row: dict, index: int, sample: Sample, system_prompt: str | None, teacher: str) -> dict:
    """One teacher completion of `row` as a conversational prompt-completion row (module docstring)."""
    out = {"prompt": prompt_messages(row, system_prompt),
           "completion": [{"role": "assistant", "content": sample.text}],
           "uid": row["uid"], "sample": index, "finish_reason": sample.finish_reason, "teacher": teacher}
    if sample.reward is not None:
        out["reward"] = sample.reward
    return out


def why_left_out(sample: Sample, min_reward: float | None, drop_truncated: bool) -> str | None:
    if drop_truncated and sample.finish_reason == "length":
        return TRUNCATED
    if min_reward is None:
        return None
    if sample.excluded is not None or sample.reward is None:
        return UNSCORED
    return BELOW_MIN_REWARD if sample.reward < min_reward else None


def teacher_rows(cfg, rows: list[dict], engine, tokenizer, samples: int = 1, generator=None, greedy: bool = False,
                 min_reward: float | None = None, drop_truncated: bool = False,
                 advance: Callable[[int], None] | None = None) -> TeacherSamples:
    """The teacher behind `engine`'s completions of `rows` (encoded training rows), as SFT rows (module docstring).
    `advance(n)` after each engine call of n prompts."""
    check_teacher_config(cfg, samples, greedy)
    params = replace(sampling_params(cfg), greedy=greedy)
    scorer = RewardScorer(cfg.reward) if min_reward is not None else None
    out = TeacherSamples()
    chunk = cfg.rollout.prompts_per_step
    for start in range(0, len(rows), chunk):
        part = rows[start: start + chunk]
        groups: list[Group] = rollout(engine, tokenizer, part, samples, params, generator)
        if scorer is not None:
            scorer.score(groups)
        for group in groups:
            for i, sample in enumerate(group.samples):
                out.sampled += 1
                why = why_left_out(sample, min_reward, drop_truncated)
                if why is not None:
                    out.left_out[why] += 1
                    continue
                out.rows.append(sample_row(group.row, i, sample, cfg.task.system_prompt, str(cfg.model.path)))
        if advance is not None:
            advance(len(part))
    return out
