"""Worked episodes of an environment: scripted policy turns played against the real environment.

With a multi-turn environment (`env.name`), `task.demonstration` is a script: a list of templates, one per
policy turn, each filled from the task row (e.g. a ```python block printing the row's expression, then
"Answer: {answer}"). The episode runner (`envs.episodes.play_episodes`) plays it exactly as it plays a
rollout, except that each policy turn is the template's text, tokenised once and ended with EOS, instead of
a sample. The environment answers every turn for real (code runs in the sandbox, tools are called, their
output is shown), so the transcript is the one a policy writing that text would see: the environment's own
opening (system prompt, tool schemas), each observation as the chat template's continuation (loss mask 0)
and the scripted turns' tokens (loss mask 1). That is what an SFT cold start for an environment trains on
(`batches.source: demonstrations`, docs/stages/sft.md).

An episode that does not follow its script to the end is left out and counted by reason: the environment
ended it before the last scripted turn or left it going after it, it ran past `env.max_episode_tokens`, or
the environment failed on it (the error is part of the reason, so the first one is shown).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch

from lmrl.config import Config
from lmrl.data.demonstrations import completion_ids
from lmrl.engines.base import Completion
from lmrl.envs.environment import build_env
from lmrl.envs.episodes import Episode, Limits, episode_seeds, play_episodes
from lmrl.types import Group, Origin, Sample

ENDED_EARLY = "ended by the environment before the script's last turn"
NOT_ENDED = "still going after the script's last turn (the environment did not end it)"
TOO_LONG = "past env.max_episode_tokens"


def demonstration_script(demonstration: str | list[str]) -> list[str]:
    """The policy turns of a demonstration: a single template is a one-turn script."""
    return [demonstration] if isinstance(demonstration, str) else list(demonstration)


def scripted_turns(tokenizer, script: list[str]) -> Callable[[list[Episode]], list[Completion]]:
    """The policy turns of `play_episodes` from a script: turn k of an episode is template k filled from its row."""
    eos = tokenizer.eos_token_id

    def turns(live: list[Episode]) -> list[Completion]:
        out = []
        for e in live:
            ids = completion_ids(tokenizer, script[len(e.replies)].format(**e.row), eos)
            out.append(Completion(ids, [0.0] * len(ids), "stop"))
        return out

    return turns


def left_out(sample: Sample, turns: int) -> str | None:
    """Why a played demonstration is not a worked episode of `turns` turns (None: it is)."""
    if sample.excluded is not None:
        return f"failed in the environment ({sample.excluded})"
    if sample.info["metrics"].get("env/truncated_tokens"):
        return TOO_LONG
    if sample.finish_reason == "length":
        return NOT_ENDED
    return ENDED_EARLY if sample.info["turns"] < turns else None


def episode_demonstrations(cfg: Config, tokenizer, rows: list[dict], prefix: str) -> tuple[list[Group], Counter]:
    """Each row's scripted episode as a one-sample group (`Origin.DATASET`), and the rows left out by reason.
    The episodes' seeds come from `task.seed`, so the same rows give the same transcripts in every run."""
    script = demonstration_script(cfg.task.demonstration)
    env = cfg.env
    limits = Limits(len(script), env.max_episode_tokens, env.step_timeout_s, env.concurrency)
    seeds = episode_seeds(torch.Generator().manual_seed(cfg.task.seed), len(rows))
    played = play_episodes(scripted_turns(tokenizer, script), tokenizer, rows, 1, seeds,
                           build_env(env.name, env.params), limits)
    kept, dropped = [], Counter()
    for i, group in enumerate(played):
        sample = group.samples[0]
        why = left_out(sample, len(script))
        if why is not None:
            dropped[why] += 1
            continue
        sample.origin = Origin.DATASET
        kept.append(Group(f"{prefix}{i}", group.row, [sample]))
    return kept, dropped
