"""A game: split a pool of items with an opponent, each side valuing the items privately.

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

With `opponent: {role: NAME}` the opponent is a role of the run (docs/roles.md) instead: a model that sees
the game from its side (its own values, each proposal as what it would get) and answers with the same
grammar, its moves parsed and applied exactly as the policy's (prose is an invalid move and never reaches
the other side). Its turns are recorded with a row that carries its side of the episode (its values, never
the policy's), whose outcome is filled in when the episode ends: the reward `negotiation_side` pays it its own
value share of the deal, or the penalty for an invalid move. `model: policy` is self-play. Against a frozen
reference (specs tasks_and_roles §C), each side's proposals are also judged by the scripted opponent's rule:
`env/scripted/*` (the policy's) and `env/opponent/scripted_*` (the role's), the counterfactual deal rate and
value share against the fixed baseline.

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
from lmrl.envs.roles import role_client
from lmrl.envs.tasks import TASKS, TaskData
from lmrl.rewards import REWARD_FNS

DEFAULT_ITEMS = {"books": 3, "hats": 2, "balls": 1}
RULES = ("Negotiate how to split a pool of items with an opponent over at most {rounds} rounds. "
         "Each round, reply with exactly one move: `PROPOSE: {example}` (the counts you keep; the opponent "
         "gets the rest) or `ACCEPT` (take the opponent's last offer). No deal by the deadline pays nothing.")
MOVE = re.compile(r"^\s*(?:(ACCEPT)|PROPOSE:((?:\s*[a-z_]+\s*=\s*\d+)+))\s*$", re.IGNORECASE)
OPPONENT_OPENING = ("{rules}\nThe pool: {pool}. Your value per item: {worths} (the whole pool is worth {total} to you). "
                    "The other side values the items differently and does not tell you how. It moves first each "
                    "round; you answer its proposal.")
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


@REWARD_FNS.register("negotiation_side", "an opponent role's reward in negotiation: its value share of the deal")
def negotiation_side(sample, **_) -> float | None:
    """The reward of an opponent role's move (`negotiation` with `opponent: {role: …}`): its own value of the deal
    as a share of its whole value (0 without a deal), or the environment's `invalid_penalty` for an invalid move.
    Its row is its side of the episode, filled in when the episode ended; None (excluded) for a move of an
    episode that never ended (cut at the token budget)."""
    side = sample.row["side"]
    if side["share"] is None:
        return None
    return side["share"] if side["valid"][sample.row["turn"]] else side["invalid_penalty"]


@ENVIRONMENTS.register("negotiation", "split items with a scripted conceding opponent or a role; paid your value share")
class NegotiationEnv:
    """A multi-issue split against a deterministic conceding opponent, or a role of the run (`opponent:
    {role: NAME}`); items are ordered by name."""

    def __init__(self, items: dict[str, int] | None = None, total_value: int = 10, max_rounds: int = 4,
                 reservation: float = 0.5, invalid_penalty: float = -0.1, attribution: str = "episode",
                 opponent: dict[str, str] | None = None):
        items = dict(sorted((items or DEFAULT_ITEMS).items()))
        if not items or any(c < 1 for c in items.values()) or max_rounds < 2 or not 0 <= reservation <= 1:
            raise ValueError("negotiation: need items with counts ≥ 1, max_rounds ≥ 2, 0 ≤ reservation ≤ 1")
        if attribution not in ("episode", "delayed"):
            raise ValueError(f"negotiation: attribution must be 'episode' or 'delayed', got {attribution!r}")
        if opponent is not None and set(opponent) != {"role"}:
            raise ValueError(f"negotiation: opponent must be {{role: NAME}} (a role of the run), got {opponent!r}")
        self.names, self.counts = list(items), tuple(items.values())
        vectors = value_vectors(self.counts, total_value)
        if not vectors or not all(partners(v, vectors) for v in vectors):
            raise ValueError(f"negotiation: total_value={total_value} leaves some values without opponent values")
        self.total, self.rounds, self.reservation = total_value, max_rounds, reservation
        self.invalid_penalty, self.attribution = invalid_penalty, attribution
        self.opponent = None if opponent is None else opponent["role"]

    def fmt(self, bundle: tuple[int, ...]) -> str:
        return " ".join(f"{n}={k}" for n, k in zip(self.names, bundle))

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        mine, theirs = draw_values(self.counts, self.total, seed)
        state = {"mine": mine, "theirs": theirs, "round": 0, "offer": None, "deal": None, "valid": []}
        pool = ", ".join(f"{c} {n}" for n, c in zip(self.names, self.counts))
        worths = ", ".join(f"{n} {v}" for n, v in zip(self.names, mine))
        rules = RULES.format(rounds=self.rounds, example=example(dict(zip(self.names, self.counts))))
        if self.opponent is not None:
            theirs_worth = ", ".join(f"{n} {v}" for n, v in zip(self.names, theirs))
            opening = OPPONENT_OPENING.format(rules=rules, pool=pool, worths=theirs_worth, total=self.total)
            # the opponent's side of the episode: all its prompts and its reward's row are built from this alone
            state.update(seed=seed, uid=row.get("uid", ""), scripted=None, opponent_scripted=None, side={
                "values": list(theirs), "chat": [], "opening": opening, "note": "", "valid": [], "share": None,
                "invalid_penalty": self.invalid_penalty})
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
        if self.opponent is not None:
            return self._role_answers(keep, state)
        need = demand(t, self.rounds, self.total, self.reservation)
        if worth(state["theirs"], tuple(c - k for c, k in zip(self.counts, keep))) >= need:
            state["deal"] = keep
            return self._end(state)
        if t >= self.rounds:
            return self._end(state)
        state["offer"] = counter_offer(self.counts, state["theirs"],
                                       demand(t + 1, self.rounds, self.total, self.reservation))
        return self._next(state, f"I reject that. I offer: you get {self.fmt(state['offer'])}.", 0.0)

    def _role_answers(self, keep: tuple[int, ...], state: dict[str, Any]) -> Step:
        """The opponent role's move on the policy's proposal `keep`: shown from its side, parsed and applied as
        the policy's moves are (ACCEPT takes the proposal; PROPOSE names the counts it keeps)."""
        t, side = state["round"], state["side"]
        gives = tuple(c - k for c, k in zip(self.counts, keep))
        if state["scripted"] is None and worth(state["theirs"], gives) >= self._demand(t):
            state["scripted"] = keep  # the first proposal the scripted opponent would have accepted
        last = " This is the last round: anything but ACCEPT ends without a deal." if t >= self.rounds else ""
        said = (f"{side['note']}Round {t} of {self.rounds}: the other side proposes to keep {self.fmt(keep)}, so you "
                f"would get {self.fmt(gives)}.{last} Reply ACCEPT or PROPOSE.")
        if not side["chat"]:
            said = f"{side['opening']}\n{said}"
        side["chat"].append({"role": "user", "content": said})
        row = {"uid": state["uid"], "values": side["values"], "turn": len(side["valid"]), "side": side}
        move = role_client(self.opponent).chat(list(side["chat"]), seed=state["seed"] * 131 + t, row=row,
                                               group=state["uid"])
        side["chat"].append({"role": "assistant", "content": move})
        try:
            counter = parse_move(move, self.names, self.counts)
        except MoveError as err:
            side["valid"].append(False)
            side["note"] = f"Invalid move: {err}. "
            said = "The opponent's move was invalid."
            if state["offer"] is not None:
                said += f" Its offer stands: you get {self.fmt(state['offer'])}."
            return self._next(state, said, 0.0)
        side["valid"].append(True)
        side["note"] = ""
        if counter is None:
            state["deal"] = keep
            return self._end(state)
        if t >= self.rounds:
            return self._end(state)
        state["offer"] = tuple(c - k for c, k in zip(self.counts, counter))
        if state["opponent_scripted"] is None and worth(state["mine"], state["offer"]) >= self._demand(t):
            state["opponent_scripted"] = counter  # the first counter a scripted responder would have accepted
        return self._next(state, f"The opponent rejects that and offers: you get {self.fmt(state['offer'])}.", 0.0)

    def _demand(self, round_: int) -> float:
        return demand(round_, self.rounds, self.total, self.reservation)

    def _next(self, state: dict[str, Any], said: str, reward: float) -> Step:
        t = state["round"]
        if t >= self.rounds:
            return self._end(state, reward)
        text = f"{said} Round {t + 1} of {self.rounds}: reply ACCEPT or PROPOSE."
        return Step([{"role": "user", "content": text}], reward, False, {"metrics": self.metrics(state)})

    def _end(self, state: dict[str, Any], reward: float = 0.0) -> Step:
        """The last step: the outcome on this turn, or attributed to every turn (`attribution: delayed`)."""
        share = self.share(state)
        if self.opponent is not None:  # what the opponent's reward reads: its own share of the deal
            deal = state["deal"]
            state["side"]["share"] = 0.0 if deal is None else worth(
                state["theirs"], tuple(c - k for c, k in zip(self.counts, deal))) / self.total
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
        if self.opponent is not None:
            out.update(self.opponent_metrics(state))
        return out

    def opponent_metrics(self, state: dict[str, Any]) -> dict[str, float]:
        """The opponent role's side, and both sides against the scripted rule (the frozen reference): the share a
        scripted opponent would have given the policy for the first of its proposals that met its demand of that
        round, and the same of the role's counters judged by a scripted responder holding the policy's values."""
        side, deal, scripted, countered = state["side"], state["deal"], state["scripted"], state["opponent_scripted"]
        theirs = 0.0 if deal is None else worth(state["theirs"], tuple(c - k for c, k in zip(self.counts, deal)))
        out = {"env/opponent/value_share": theirs / self.total,
               "env/scripted/deal": float(scripted is not None),
               "env/scripted/value_share": 0.0 if scripted is None else worth(state["mine"], scripted) / self.total,
               "env/opponent/scripted_deal": float(countered is not None),
               "env/opponent/scripted_value_share":
                   0.0 if countered is None else worth(state["theirs"], countered) / self.total}
        if side["valid"]:
            out["env/opponent/invalid"] = side["valid"].count(False) / len(side["valid"])
        return out
