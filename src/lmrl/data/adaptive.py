"""Samplers that choose prompts from their observed rewards: HIVE and difficulty curricula (docs/data.md).

Both walk the uniform sampler's shuffled passes and take the rows their rule admits; rows passed
over come back in the next pass. Their history is a `PromptStats` (p̂ per prompt, by row uid),
checkpointed with the sampler's own state.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable

from lmrl.data.prompt_stats import PromptStats
from lmrl.data.samplers import SAMPLERS, UniformSampler
from lmrl.types import Group


def history_filter(p_hat: list[float | None], band: tuple[float, float] | None = (0.1, 0.9),
                   top_k: int | None = None, prior: float = 0.5) -> list[int]:
    """HIVE stage 1: indices of the prompts near the learning edge by their past p̂ (None: never seen,
    taken as `prior`). `band` [a, b) keeps a ≤ p̂ < b; `top_k` instead keeps the k highest utilities
    p̂(1 − p̂), ties at the k-th included."""
    p = [prior if x is None else x for x in p_hat]
    if top_k is not None:
        utility = [x * (1 - x) for x in p]
        cut = sorted(utility, reverse=True)[min(top_k, len(p)) - 1]
        return [i for i, u in enumerate(utility) if u >= cut]
    lo, hi = band
    return [i for i, x in enumerate(p) if lo <= x < hi]


def entropy_filter(entropies: list[float], threshold: float) -> list[bool]:
    """HIVE stage 2: keep a prompt whose current-policy entropy is at least `threshold` (below it the
    policy is already sure of its answer: the history's utility is stale)."""
    return [h >= threshold for h in entropies]


def _pair(value, name: str) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not 0 <= value[0] < value[1] <= 1:
        raise ValueError(f"{name} must be [low, high] with 0 ≤ low < high ≤ 1 (got {value!r})")
    return float(value[0]), float(value[1])


class _Adaptive(UniformSampler):
    """Shuffled passes plus a `PromptStats` history; `observe` feeds the history."""

    def __init__(self, rows, seed: int, metric: str, accuracy_component: str):
        super().__init__(rows, seed)
        self.stats = PromptStats(metric, accuracy_component)
        self.uids = [str(r["uid"]) for r in rows]

    def take(self, n: int, admits: Callable[[int], bool]) -> list[int]:
        """Up to `n` distinct rows the rule admits, in pass order; scanning at most two passes' worth of
        rows, it finds them whenever that many are admitted."""
        out: list[int] = []
        for _ in range(2 * len(self.rows)):
            if len(out) == n:
                break
            i = self.next_index()
            if admits(i) and i not in out:
                out.append(i)
        return out

    def observe(self, groups: list[Group]) -> None:
        self.stats.observe(groups)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), **self.stats.summary(len(self.rows))}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.stats.load_state_dict(state["stats"])


ENTROPY_THRESHOLD = 0.2  # HIVE: prompts whose probed entropy is below it are dropped (0: no probe)


@SAMPLERS.register("hive", "HIVE: prompts near the learning edge by history, then by the policy's prompt entropy")
class HiveSampler(_Adaptive):
    """HIVE (arXiv 2603.25184; confidence low: a reconstruction from the abstract).

    Stage 1 keeps prompts whose past p̂ lies in `band` [a, b) (or, with `top_k`, the k highest
    utilities p̂(1 − p̂)); unseen prompts count as p̂ = 0.5, in the band. Stage 2 probes the
    candidates with the current policy (`probe_tokens` sampled tokens) and drops those whose mean
    next-token entropy is below `entropy_threshold` (0: no stage 2). After `probe_rounds` rounds, or
    when no stage-1 row is left, the batch is filled with the dropped candidates of highest entropy,
    then with the next rows of the pass.
    """

    def __init__(self, rows: list[dict[str, Any]], seed: int = 0, accuracy_component: str = "answer",
                 band: list[float] = (0.1, 0.9), top_k: int | None = None,
                 entropy_threshold: float = ENTROPY_THRESHOLD,
                 probe_tokens: int = 8, probe_rounds: int = 3, metric: str = "accuracy"):
        super().__init__(rows, seed, metric, accuracy_component)
        self.band = _pair(band, "band")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be ≥ 1 or null (got {top_k})")
        if entropy_threshold < 0 or probe_tokens < 1 or probe_rounds < 1:
            raise ValueError("entropy_threshold must be ≥ 0, probe_tokens and probe_rounds ≥ 1")
        self.top_k, self.entropy_threshold = top_k, float(entropy_threshold)
        self.probe_tokens, self.probe_rounds = probe_tokens, probe_rounds
        self.needs_probe = self.probes(entropy_threshold=self.entropy_threshold)
        self.probe: Callable[[list[dict], int], list[float]] | None = None  # bound by the run (lmrl.data.probe)
        self.last = {"sampler/in_edge_share": 1.0, "sampler/probed": 0.0, "sampler/probe_dropped": 0.0}

    @staticmethod
    def probes(entropy_threshold: float = ENTROPY_THRESHOLD, **_: Any) -> bool:
        """Whether a sampler with these knobs probes prompts with the current policy (config validation asks)."""
        return entropy_threshold > 0

    def next_prompts(self, n: int) -> list[dict[str, Any]]:
        in_edge = set(history_filter([self.stats.p_hat(u) for u in self.uids], self.band, self.top_k))
        chosen: list[int] = []
        dropped: list[tuple[float, int]] = []
        for _ in range(self.probe_rounds if self.needs_probe else 1):
            candidates = self.take(n - len(chosen), lambda i: i in in_edge)
            if not candidates:
                break
            if not self.needs_probe:
                chosen += candidates
                break
            if self.probe is None:
                raise RuntimeError("hive's stage 2 needs the run's probe (lmrl.data.probe.bind_probe)")
            entropies = self.probe([self.rows[i] for i in candidates], self.probe_tokens)
            for i, h, keep in zip(candidates, entropies, entropy_filter(entropies, self.entropy_threshold)):
                if keep:
                    chosen.append(i)
                else:
                    dropped.append((h, i))
            if len(chosen) == n:
                break
        filled = n - len(chosen)
        chosen += [i for _, i in sorted(dropped, key=lambda d: -d[0])][: n - len(chosen)]
        chosen += [self.next_index() for _ in range(n - len(chosen))]
        self.last = {"sampler/in_edge_share": len(in_edge) / len(self.rows), "sampler/probe_dropped": float(len(dropped)),
                     "sampler/filled_outside": float(filled)}
        return [self.rows[i] for i in chosen]

    def metrics(self) -> dict[str, float]:
        """Besides the history: the share of rows in the stage-1 edge, the candidates the probe dropped and
        the batch slots filled from outside the accepted ones, at the last draw."""
        return {**super().metrics(), **self.last}


@SAMPLERS.register("curriculum", "difficulty curriculum: a pass-rate window and/or an easy-to-hard schedule")
class CurriculumSampler(_Adaptive):
    """Difficulty curricula (standard techniques, no single source).

    Pass-rate window: only rows whose p̂ lies in `window` [lo, hi] (unseen rows count as `prior`); when
    fewer than a batch qualify, the window widens by `widen` on each side until enough do.
    Schedule (with `difficulty_field`, a dotted path into the row such as `entry.metadata.num_digits`):
    a row is available once its difficulty rank q (the share of rows strictly easier) is at most
    start + (1 − start) · min(1, t / ramp_steps), t being the policy version of the newest rollouts
    observed; both rules apply together.
    """

    def __init__(self, rows: list[dict[str, Any]], seed: int = 0, accuracy_component: str = "answer",
                 window: list[float] = (0.0, 1.0), widen: float = 0.1, prior: float = 0.5,
                 difficulty_field: str | None = None, start: float = 0.25, ramp_steps: int = 10,
                 metric: str = "accuracy"):
        super().__init__(rows, seed, metric, accuracy_component)
        self.window = _pair(window, "window")
        if not 0 < widen <= 1 or not 0 <= prior <= 1 or not 0 <= start <= 1 or ramp_steps < 1:
            raise ValueError("need 0 < widen ≤ 1, 0 ≤ prior ≤ 1, 0 ≤ start ≤ 1 and ramp_steps ≥ 1")
        self.widen, self.prior, self.start, self.ramp_steps = float(widen), float(prior), float(start), ramp_steps
        self.rank = difficulty_ranks(rows, difficulty_field) if difficulty_field else [0.0] * len(rows)
        self.last = {"sampler/window_low": self.window[0], "sampler/window_high": self.window[1]}

    def frontier(self) -> float:
        """The hardest difficulty rank available now."""
        return self.start + (1 - self.start) * min(1.0, self.stats.clock / self.ramp_steps)

    def next_prompts(self, n: int) -> list[dict[str, Any]]:
        reach = self.frontier()
        available = [i for i, q in enumerate(self.rank) if q <= reach + 1e-12]
        p = {i: self.stats.p_hat(self.uids[i], self.prior) for i in available}
        lo, hi = self.window
        while True:
            eligible = {i for i in available if lo <= p[i] <= hi}
            if len(eligible) >= n or (lo <= 0 and hi >= 1):
                break
            lo, hi = max(0.0, lo - self.widen), min(1.0, hi + self.widen)
        self.last = {"sampler/window_low": lo, "sampler/window_high": hi, "sampler/frontier": reach,
                     "sampler/eligible": float(len(eligible))}
        chosen = self.take(n, lambda i: i in eligible)
        while len(chosen) < n:  # fewer eligible rows than a batch: they repeat
            chosen += self.take(n - len(chosen), lambda i: i in eligible)
        return [self.rows[i] for i in chosen]

    def metrics(self) -> dict[str, float]:
        """Besides the history: the pass-rate window after widening, the schedule's frontier and the rows
        eligible, at the last draw."""
        return {**super().metrics(), **self.last}


def difficulty_ranks(rows: list[dict[str, Any]], field: str) -> list[float]:
    """Each row's share of rows strictly easier by the numeric value at dotted path `field`."""
    values = []
    for row in rows:
        node: Any = row
        for part in field.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"difficulty_field {field!r}: row {row.get('uid')!r} has no {part!r}")
            node = node[part]
        if isinstance(node, bool) or not isinstance(node, (int, float)):
            raise ValueError(f"difficulty_field {field!r}: row {row.get('uid')!r} holds {node!r}, not a number")
        values.append(float(node))
    ordered = sorted(values)
    return [bisect_left(ordered, v) / len(values) for v in values]
