"""The episode runner: multi-turn episodes of many prompts, turn rounds batched across episodes.

`run_episodes` plays `n` episodes per task row against the policy. Every turn round sends the next
turn of all live episodes to the engine in one `engine.generate(prompts, 1, ...)` call (any engine
works: it only sees prompts), then lets the environment answer each reply (`step`, in a thread pool,
under `env.step_timeout_s`). The calls ask the engine to keep each episode's KV for its next turn
(`SamplingParams.keep_prefix`: a turn then prefills only the tokens added since). An episode is one
token sequence: the opening prompt, then each policy turn's token ids exactly as sampled (loss mask
1, their behaviour log-probs) and each observation's chat-template continuation (`lmrl.envs.chat`;
loss mask 0, log-prob 0.0). Nothing the policy generated is re-tokenised.

Limits: `env.max_turns` policy turns and `env.max_episode_tokens` tokens after the prompt (a turn is
cut to fit; an observation that does not fit ends the episode); either ends it with finish reason
"length" and is counted. An environment that raises, hangs past the timeout or answers with
something malformed ends its episode with `Sample.excluded` set (the reason) and is counted; the
run goes on, and the first exception of each kind is printed with its traceback. docs/environments.md describes the protocol and the conventions.
"""
from __future__ import annotations

import math
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from lmrl.envs.chat import TemplateError, encode_opening, observation_ids
from lmrl.envs.environment import EnvError, check_messages, check_step
from lmrl.types import Group, Sample


@dataclass
class Limits:
    max_turns: int = 8
    max_episode_tokens: int = 1024
    step_timeout_s: float = 30.0
    concurrency: int = 8


@dataclass
class Episode:
    """One episode being played: its tokens so far and its bookkeeping."""

    row: dict[str, Any]
    seed: int
    state: Any = None
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # everything after the prompt
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    turn_lengths: list[int] = field(default_factory=list)  # policy tokens of each turn
    turn_starts: list[int] = field(default_factory=list)  # where each turn's tokens start in `ids`
    eligible: list[bool] | None = None  # per turn, from the last step's info["turn_eligible"]; None: all
    last_token: int | None = None  # the last turn's final token when the turn ended itself (EOS)
    messages: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    finish_reason: str = "stop"
    excluded: str | None = None
    done: bool = False

    def end(self, finish_reason: str = "stop", excluded: str | None = None, metric: str | None = None) -> None:
        self.done, self.finish_reason, self.excluded = True, finish_reason, excluded
        if metric:
            self.metrics[metric] = 1.0

    def to_sample(self) -> Sample:
        """The episode as one Sample; an ineligible turn's tokens leave the loss and its reward the return."""
        eligible = self.eligible or [True] * len(self.replies)
        mask = list(self.mask)
        for start, length, ok in zip(self.turn_starts, self.turn_lengths, eligible):
            if not ok:
                mask[start:start + length] = [0] * length
        info = {"turns": len(self.replies), "turn_rewards": list(self.turn_rewards),
                "turn_lengths": list(self.turn_lengths), "turn_eligible": list(eligible),
                "env_return": float(sum(r for r, ok in zip(self.turn_rewards, eligible) if ok)),
                "messages": self.messages, "metrics": self.episode_metrics()}
        return Sample(prompt_ids=self.prompt_ids, completion_ids=self.ids, behaviour_logprobs=self.logprobs,
                      finish_reason=self.finish_reason, policy_version=self.versions, excluded=self.excluded,
                      info=info, loss_mask=mask, text=self.replies[-1] if self.replies else "", row=self.row)

    def episode_metrics(self) -> dict[str, float]:
        base = {"env/turns": float(len(self.replies)), "env/error": 0.0, "env/truncated_turns": 0.0,
                "env/truncated_tokens": 0.0, "env/episode_tokens": float(len(self.ids))}
        return {**base, **self.metrics}


class StepPool:
    """Environment calls in worker threads, each bounded by a timeout measured from when it starts.

    A thread cannot be killed: a call that times out keeps its worker, so the pool is replaced and later
    calls never queue behind a hung one (as the reward scorer does)."""

    def __init__(self, workers: int, timeout_s: float):
        self.workers, self.timeout_s = workers, timeout_s
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="env")

    def run(self, calls: list[Callable[[], Any]]) -> list[tuple[Any, str | None]]:
        """(result, None) or (None, problem) for each call, in order."""
        started: dict[int, float] = {}

        def timed(i: int, fn: Callable[[], Any]) -> Any:
            started[i] = time.monotonic()
            return fn()

        futures: list[Future] = [self.pool.submit(timed, i, fn) for i, fn in enumerate(calls)]
        out: list[tuple[Any, str | None] | None] = [None] * len(calls)
        pending = set(range(len(calls)))
        hung = False
        while pending:
            wait([futures[i] for i in pending], timeout=0.05, return_when=FIRST_COMPLETED)
            now = time.monotonic()
            for i in list(pending):
                if futures[i].done():
                    err = futures[i].exception()
                    out[i] = (None, f"{type(err).__name__}: {err}") if err else (futures[i].result(), None)
                    if err is not None:
                        show_first(err)
                    pending.discard(i)
                elif i in started and now - started[i] > self.timeout_s:
                    out[i], hung = (None, f"timeout after {self.timeout_s:g}s"), True
                    pending.discard(i)
        if hung:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="env")
        return out


_SHOWN: set[tuple[str, str]] = set()


def show_first(err: BaseException) -> None:
    """Print an environment's exception with its traceback the first time one of its kind (type and message) is
    raised in this process: its episode is excluded and counted (`env/error`), never silently."""
    key = (type(err).__name__, str(err)[:200])
    if key in _SHOWN:
        return
    _SHOWN.add(key)
    trace = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    print(f"env: an episode was excluded (counted in env/error; later ones like it are not printed):\n{trace}",
          file=sys.stderr, flush=True)


def episode_seeds(generator: torch.Generator | None, count: int) -> list[int]:
    """One seed per episode, drawn from the rollout generator (saved in checkpoints: resumable)."""
    return torch.randint(0, 2**31 - 1, (count,), generator=generator).tolist()


def run_episodes(engine, tokenizer, rows: list[dict[str, Any]], n: int, params, env, limits: Limits,
                 generator: torch.Generator | None = None, steps: StepPool | None = None) -> list[Group]:
    """`n` episodes of `env` per row, as Groups of Samples (one per row, in order)."""
    turn_params = replace(params, keep_prefix=True)

    def sampled(live: list[Episode]) -> list:
        return [outs[0] for outs in engine.generate([e.prompt_ids + e.ids for e in live], 1, turn_params, generator)]

    return play_episodes(sampled, tokenizer, rows, n, episode_seeds(generator, len(rows) * n), env, limits, steps)


def play_episodes(turns: Callable[[list[Episode]], list], tokenizer, rows: list[dict[str, Any]], n: int,
                  seeds: list[int], env, limits: Limits, steps: StepPool | None = None) -> list[Group]:
    """`n` episodes of `env` per row, whose policy turns `turns` writes: given the live episodes, one
    `Completion` each (an engine's samples, or a scripted demonstration's tokens)."""
    own = steps is None
    steps = steps or StepPool(limits.concurrency, limits.step_timeout_s)
    episodes = [Episode(row=row, seed=seeds[i * n + j]) for i, row in enumerate(rows) for j in range(n)]
    try:
        _open(episodes, env, tokenizer, steps)
        while live := [e for e in episodes if not e.done]:
            replied = [e for e, c in zip(live, turns(live)) if _append_turn(e, c, tokenizer, limits)]
            results = steps.run([lambda e=e: env.step(e.replies[-1], e.state) for e in replied])
            for e, (step, problem) in zip(replied, results):
                _answer(e, step, problem, tokenizer, limits)
    finally:
        if own:
            steps.pool.shutdown(wait=False, cancel_futures=True)
    samples = [e.to_sample() for e in episodes]
    return [Group(uid=row["uid"], row=row, samples=samples[i * n:(i + 1) * n]) for i, row in enumerate(rows)]


def _open(episodes: list[Episode], env, tokenizer, steps: StepPool) -> None:
    tools = getattr(env, "tools", None)
    results = steps.run([lambda e=e: env.reset(e.row, e.seed) for e in episodes])
    for e, (opened, problem) in zip(episodes, results):
        try:
            if problem is not None:
                raise EnvError(problem)
            if not isinstance(opened, tuple) or len(opened) != 2:
                raise EnvError(f"reset must return (messages, state), got {type(opened).__name__}")
            messages, e.state = opened
            e.messages = [dict(m) for m in check_messages(messages, "reset messages")]
            e.prompt_ids = encode_opening(tokenizer, e.messages, tools)
        except (EnvError, TemplateError) as err:
            e.prompt_ids = list(e.row.get("prompt_ids") or [tokenizer.eos_token_id])
            e.end(excluded=f"env reset: {err}", metric="env/error")


def _append_turn(e: Episode, c, tokenizer, limits: Limits) -> bool:
    """Append a policy turn exactly as sampled (cut to the token budget); True when the env should answer."""
    room = limits.max_episode_tokens - len(e.ids)
    ids, logprobs = c.token_ids[:room], c.logprobs[:room]
    versions = (c.policy_version or [0] * len(c.token_ids))[:room]
    e.turn_starts.append(len(e.ids))
    e.ids += ids
    e.mask += [1] * len(ids)
    e.logprobs += logprobs
    e.versions += versions
    reply = tokenizer.decode(ids, skip_special_tokens=True)
    e.replies.append(reply)
    e.turn_lengths.append(len(ids))
    e.messages.append({"role": "assistant", "content": reply})
    e.last_token = ids[-1] if ids and c.finish_reason == "stop" and len(ids) == len(c.token_ids) else None
    if len(ids) < len(c.token_ids) or len(e.ids) >= limits.max_episode_tokens:
        e.end("length", metric="env/truncated_tokens")
        return False
    return True


def _attribute(e: Episode, info: dict[str, Any]) -> None:
    """The last step may re-attribute the episode's turns (`envs.attribution`): `info["turn_rewards"]`
    replaces every turn's reward, `info["turn_eligible"]` takes turns out of the loss."""
    turns = len(e.replies)
    rewards, eligible = info.get("turn_rewards"), info.get("turn_eligible")
    if rewards is not None:
        if not isinstance(rewards, list) or len(rewards) != turns or not all(
                isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in rewards):
            raise EnvError(f"info['turn_rewards'] must be {turns} finite numbers (one per turn), got {rewards!r:.80}")
        e.turn_rewards = [float(r) for r in rewards]
    if eligible is not None:
        if not isinstance(eligible, list) or len(eligible) != turns or not all(isinstance(x, bool) for x in eligible):
            raise EnvError(f"info['turn_eligible'] must be {turns} bools (one per turn), got {eligible!r:.80}")
        e.eligible = list(eligible)


def _answer(e: Episode, step, problem: str | None, tokenizer, limits: Limits) -> None:
    """Record the environment's answer to the episode's last turn, and append its observation."""
    try:
        if problem is not None:
            raise EnvError(problem)
        step = check_step(step)
    except EnvError as err:
        e.end(excluded=f"env step: {err}", metric="env/error")
        return
    e.turn_rewards.append(float(step.reward))
    e.metrics.update(step.info.get("metrics", {}))
    if step.done:
        try:
            _attribute(e, step.info)
        except EnvError as err:
            e.end(excluded=f"env step: {err}", metric="env/error")
            return
        e.end()
        return
    if len(e.replies) >= limits.max_turns:
        e.end("length", metric="env/truncated_turns")
        return
    try:
        obs = observation_ids(tokenizer, step.observation, e.last_token)
    except TemplateError as err:
        e.end(excluded=f"env observation: {err}", metric="env/error")
        return
    if len(e.ids) + len(obs) >= limits.max_episode_tokens:  # no room left for another policy token
        e.end("length", metric="env/truncated_tokens")
        return
    e.ids += obs
    e.mask += [0] * len(obs)
    e.logprobs += [0.0] * len(obs)
    e.versions += [e.versions[-1] if e.versions else 0] * len(obs)
    e.messages += [dict(m) for m in step.observation]
