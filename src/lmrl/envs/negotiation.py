"""A game: split a pool of items with a scripted opponent, each side valuing the items privately.

The pool holds `items` (name → count, e.g. 3 books, 2 hats, 1 ball). Each side's private value per
item is drawn from the episode seed (integers with Σ count · value = `total_value` for each side), so
what one side gives up cheaply the other may want. The policy moves first each round: it proposes
what it keeps (`PROPOSE: balls=1 books=0 hats=2`) or accepts the opponent's last counter-offer
(`ACCEPT`). The opponent is deterministic: its demand falls linearly from its whole value in round 1
to its reservation value (`reservation` · total) in the last round; it accepts a proposal that gives
it at least its demand, walks away after the last round, and otherwise counters with the split
that meets its next round's demand at the least value to itself (items it values little go to the
policy).
Reward: the policy's value of a deal as a share of its maximum (0 without one), invalid moves
`invalid_penalty`; with `attribution: delayed` the outcome is attributed to every valid turn
(`delayed_attribution`). Metrics: deal rate, value share, turns, invalid share and the share of
deals that are Pareto-optimal (exact, by enumerating every split).

Rows only seed episodes (task `negotiation`: the rules as the question).
"""
from __future__ import annotations

import itertools
import random
import re
from typing import Any

from lmrl.config import TaskConfig
from lmrl.envs.attribution import delayed_attribution
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.tasks import TASKS, TaskData

DEFAULT_ITEMS = {"books": 3, "hats": 2, "balls": 1}
RULES = ("Negotiate how to split a pool of items with an opponent over at most {rounds} rounds. "
         "Each round, reply with exactly one move: `PROPOSE: {example}` (the counts you keep; the opponent "
         "gets the rest) or `ACCEPT` (take the opponent's last offer). No deal by the deadline pays nothing.")
MOVE = re.compile(r"^\s*(?:(ACCEPT)|PROPOSE:((?:\s*[a-z_]+\s*=\s*\d+)+))\s*$", re.IGNORECASE)
PAIR = re.compile(r"([a-z_]+)\s*=\s*(\d+)", re.IGNORECASE)


class MoveError(ValueError):
    """A reply that is not a well-formed move."""


def example(items: dict[str, int]) -> str:
    """A sample proposal for the rules: half of each item, rounded down."""
    return " ".join(f"{n}={c // 2}" for n, c in items.items())


def value_vectors(counts: tuple[int, ...], total: int) -> list[tuple[int, ...]]:
    """Every vector of non-negative integer values with Σ count · value = total."""
    ranges = [range(total // c + 1) for c in counts]
    return [v for v in itertools.product(*ranges) if sum(c * x for c, x in zip(counts, v)) == total]


def draw_values(counts: tuple[int, ...], total: int, seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The policy's and the opponent's values for an episode: the policy's uniform over `value_vectors`,
    the opponent's uniform over those that differ from it and leave no item worthless to both."""
    rng = random.Random(seed)
    vectors = value_vectors(counts, total)
    mine = rng.choice(vectors)
    return mine, rng.choice(partners(mine, vectors))


def partners(mine: tuple[int, ...], vectors: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The opponent value vectors allowed against `mine`."""
    return [v for v in vectors if v != mine and all(a or b for a, b in zip(mine, v))]


def parse_move(reply: str, names: list[str], counts: tuple[int, ...]) -> tuple[int, ...] | None:
    """None for ACCEPT, else the counts the policy keeps; a MoveError says what is wrong."""
    found = MOVE.match(reply)
    if not found:
        raise MoveError(f"reply with exactly `ACCEPT` or `PROPOSE: {' '.join(f'{n}=K' for n in names)}`")
    if found.group(1):
        return None
    keep: dict[str, int] = {}
    for name, k in PAIR.findall(found.group(2)):
        name = name.lower()
        if name not in names or name in keep:
            raise MoveError(f"{name!r} is not an item or is named twice; items: {', '.join(names)}")
        keep[name] = int(k)
    if len(keep) != len(names):
        raise MoveError(f"name every item once: {', '.join(names)}")
    for name, c in zip(names, counts):
        if keep[name] > c:
            raise MoveError(f"there are only {c} {name}")
    return tuple(keep[n] for n in names)


def worth(values: tuple[int, ...], bundle: tuple[int, ...]) -> int:
    return sum(v * k for v, k in zip(values, bundle))


def splits(counts: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every split, as the counts the policy keeps, in a fixed order."""
    return list(itertools.product(*(range(c + 1) for c in counts)))


def pareto_optimal(keep: tuple[int, ...], counts: tuple[int, ...], mine: tuple[int, ...],
                   theirs: tuple[int, ...]) -> bool:
    """Whether no other split gives both sides at least as much and one of them more."""
    def utilities(k):
        return worth(mine, k), worth(theirs, tuple(c - x for c, x in zip(counts, k)))

    u = utilities(keep)
    return not any(o[0] >= u[0] and o[1] >= u[1] and o != u for o in map(utilities, splits(counts)))


def demand(round_: int, rounds: int, total: int, reservation: float) -> float:
    """The opponent's demand in round `round_` (1-based): its total in round 1, linearly down to
    `reservation` · total in the last round."""
    return total * (reservation + (1 - reservation) * (rounds - round_) / (rounds - 1))


def counter_offer(counts: tuple[int, ...], theirs: tuple[int, ...], need: float) -> tuple[int, ...]:
    """The split (counts the policy keeps) that gives the opponent at least `need` at the least value
    to itself, ties to the one leaving the policy most items, then the first in `splits` order."""
    def cost(keep):
        return worth(theirs, tuple(c - k for c, k in zip(counts, keep))), -sum(keep)

    return min((k for k in splits(counts) if cost(k)[0] >= need), key=cost)


@TASKS.register("negotiation", "rows that only seed negotiation episodes (env.name: negotiation)")
def negotiation_task(cfg: TaskConfig) -> TaskData:
    items = dict(sorted(cfg.params.get("items", DEFAULT_ITEMS).items()))
    question = RULES.format(rounds=cfg.params.get("max_rounds", 4), example=example(items))
    rows = [{"uid": f"negotiation-{i}", "question": question, "answer": ""}
            for i in range(cfg.num_train + cfg.num_eval)]
    return TaskData(rows[: cfg.num_train], rows[cfg.num_train:])


@ENVIRONMENTS.register("negotiation", "split items with a scripted conceding opponent; paid the share of your value")
class NegotiationEnv:
    """A multi-issue split against a deterministic conceding opponent; items are ordered by name."""

    def __init__(self, items: dict[str, int] | None = None, total_value: int = 10, max_rounds: int = 4,
                 reservation: float = 0.5, invalid_penalty: float = -0.1, attribution: str = "episode"):
        items = dict(sorted((items or DEFAULT_ITEMS).items()))
        if not items or any(c < 1 for c in items.values()) or max_rounds < 2 or not 0 <= reservation <= 1:
            raise ValueError("negotiation: need items with counts ≥ 1, max_rounds ≥ 2, 0 ≤ reservation ≤ 1")
        if attribution not in ("episode", "delayed"):
            raise ValueError(f"negotiation: attribution must be 'episode' or 'delayed', got {attribution!r}")
        self.names, self.counts = list(items), tuple(items.values())
        vectors = value_vectors(self.counts, total_value)
        if not vectors or not all(partners(v, vectors) for v in vectors):
            raise ValueError(f"negotiation: total_value={total_value} leaves some values without opponent values")
        self.total, self.rounds, self.reservation = total_value, max_rounds, reservation
        self.invalid_penalty, self.attribution = invalid_penalty, attribution

    def fmt(self, bundle: tuple[int, ...]) -> str:
        return " ".join(f"{n}={k}" for n, k in zip(self.names, bundle))

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        mine, theirs = draw_values(self.counts, self.total, seed)
        state = {"mine": mine, "theirs": theirs, "round": 0, "offer": None, "deal": None, "valid": []}
        pool = ", ".join(f"{c} {n}" for n, c in zip(self.names, self.counts))
        worths = ", ".join(f"{n} {v}" for n, v in zip(self.names, mine))
        rules = RULES.format(rounds=self.rounds, example=example(dict(zip(self.names, self.counts))))
        text = (f"{rules}\nThe pool: {pool}. "
                f"Your value per item: {worths} (the whole pool is worth {self.total} to you). The opponent values "
                f"the items differently and does not tell you how. Round 1 of {self.rounds}: your move.")
        return [{"role": "user", "content": text}], state

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        state["round"] += 1
        t = state["round"]
        try:
            keep = parse_move(reply, self.names, self.counts)
            if keep is None and state["offer"] is None:
                raise MoveError("there is no offer to accept yet: PROPOSE first")
        except MoveError as err:
            state["valid"].append(False)
            said = f"Invalid move: {err}."
            if state["offer"] is not None:
                said += f" My offer stands: you get {self.fmt(state['offer'])}."
            return self._next(state, said, self.invalid_penalty)
        state["valid"].append(True)
        if keep is None:
            state["deal"] = state["offer"]
            return self._end(state)
        need = demand(t, self.rounds, self.total, self.reservation)
        if worth(state["theirs"], tuple(c - k for c, k in zip(self.counts, keep))) >= need:
            state["deal"] = keep
            return self._end(state)
        if t >= self.rounds:
            return self._end(state)
        state["offer"] = counter_offer(self.counts, state["theirs"],
                                       demand(t + 1, self.rounds, self.total, self.reservation))
        return self._next(state, f"I reject that. I offer: you get {self.fmt(state['offer'])}.", 0.0)

    def _next(self, state: dict[str, Any], said: str, reward: float) -> Step:
        t = state["round"]
        if t >= self.rounds:
            return self._end(state, reward)
        text = f"{said} Round {t + 1} of {self.rounds}: reply ACCEPT or PROPOSE."
        return Step([{"role": "user", "content": text}], reward, False, {"metrics": self.metrics(state)})

    def _end(self, state: dict[str, Any], reward: float = 0.0) -> Step:
        """The last step: the outcome on this turn, or attributed to every turn (`attribution: delayed`)."""
        share = self.share(state)
        info: dict[str, Any] = {"metrics": self.metrics(state)}
        if self.attribution == "delayed":
            info.update(delayed_attribution(share, state["valid"], invalid_penalty=self.invalid_penalty))
        return Step(None, reward + share, True, info)

    def share(self, state: dict[str, Any]) -> float:
        deal = state["deal"]
        return 0.0 if deal is None else worth(state["mine"], deal) / worth(state["mine"], self.counts)

    def metrics(self, state: dict[str, Any]) -> dict[str, float]:
        valid = state["valid"]
        out = {"env/deal": float(state["deal"] is not None), "env/value_share": self.share(state),
               "env/turns": float(len(valid)), "env/invalid": valid.count(False) / len(valid)}
        if state["deal"] is not None:
            out["env/pareto"] = float(pareto_optimal(state["deal"], self.counts, state["mine"], state["theirs"]))
        return out
