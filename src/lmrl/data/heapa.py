"""HeaPA: heap boundary sampling from a reward-partitioned prompt pool (docs/data.md).

Pool mechanics after horizon-rl/HeaPA `slime/heapa_core.py` (confidence high): a cold FIFO of
unscored rows, a low partition (max-heap on reward, about `low_fraction` of the capacity: the
harder rows) and a high partition (the easier rows). The teacher that writes new queries from
medium-reward prompts is not part of lmrl, so the pool holds the training rows only.
"""
from __future__ import annotations

import copy
import heapq
import random
from collections import Counter, deque
from typing import Any

from lmrl.data.prompt_stats import PromptStats, base_uid
from lmrl.data.samplers import SAMPLERS
from lmrl.types import Group

MODES = ("medium", "mixed")


@SAMPLERS.register("heapa", "HeaPA: cold rows first, then rows from the low-reward partition of a heap pool")
class HeapaSampler:
    """HeaPA's pool (horizon-rl/HeaPA, slime version; confidence high for the pool mechanics; the
    teacher augmentation and its reward aggregation, low confidence, are left out).

    A batch takes cold (unscored) rows first, then draws uniformly from the low partition without
    removing them (`mode=medium`), or pops half of the rest from the top of the high partition and
    draws the other half from low (`mode=mixed`). A group's mean reward becomes its row's reward: a
    cold or popped row is inserted (into low while low holds < capacity · low_fraction rows, else
    into high if its reward ≥ the largest in low, else into low); a row still in the pool is updated
    in place. Over `capacity`, high's lowest reward is evicted first, then low's, then cold's oldest;
    when the pool falls under `reseed_below` rows, evicted rows return as cold ones.
    """

    def __init__(self, rows: list[dict[str, Any]], seed: int = 0, accuracy_component: str = "answer",
                 capacity: int | None = None, low_fraction: float = 0.5, mode: str = "medium",
                 reseed_below: int = 100, metric: str = "reward"):
        if not rows:
            raise ValueError("the sampler has no rows to draw from")
        if mode not in MODES or not 0 < low_fraction < 1 or (capacity is not None and capacity < 1):
            raise ValueError(f"need mode in {MODES}, 0 < low_fraction < 1, capacity ≥ 1 or null "
                             f"(got {mode!r}, {low_fraction}, {capacity})")
        self.rows, self.mode, self.reseed_below = rows, mode, reseed_below
        self.capacity, self.low_fraction = capacity or len(rows), float(low_fraction)
        self.index = {str(r["uid"]): i for i, r in enumerate(rows)}
        self.stats = PromptStats(metric, accuracy_component)
        self.rng = random.Random(seed)
        order = list(range(len(rows)))
        self.rng.shuffle(order)
        self.cold: deque[int] = deque(order)
        self.low: list[tuple[float, int, int]] = []  # heap of (−reward, seq, row)
        self.high: dict[int, tuple[float, int]] = {}  # row -> (reward, seq)
        self.in_flight: Counter[int] = Counter()  # drawn out of the pool, back when observed
        self.archive: set[int] = set()  # evicted rows
        self.seq = 0
        self.evict()

    @property
    def low_cap(self) -> int:
        return int(self.capacity * self.low_fraction)

    def size(self) -> int:
        return len(self.cold) + len(self.low) + len(self.high)

    def insert(self, i: int, reward: float) -> None:
        """Place a scored row: low while it has room, else high when reward ≥ low's largest, else low."""
        self.seq += 1
        if len(self.low) >= self.low_cap and reward >= (-self.low[0][0] if self.low else float("-inf")):
            self.high[i] = (reward, self.seq)
        else:
            heapq.heappush(self.low, (-reward, self.seq, i))

    def evict(self) -> None:
        while self.size() > self.capacity:
            if self.high:
                i = min(self.high, key=self.high.get)
                del self.high[i]
            elif self.low:
                i = self.take_low(max(range(len(self.low)), key=lambda k: self.low[k][:2]))[2]  # lowest reward
            else:
                i = self.cold.popleft()
            self.archive.add(i)

    def take_low(self, k: int) -> tuple[float, int, int]:
        """Remove and return entry `k` of the low heap."""
        entry = self.low[k]
        self.low[k] = self.low[-1]
        self.low.pop()
        heapq.heapify(self.low)
        return entry

    def pop_high(self) -> int:
        i = max(self.high, key=lambda j: (self.high[j][0], -self.high[j][1]))
        del self.high[i]
        return i

    def next_prompts(self, n: int) -> list[dict[str, Any]]:
        if self.size() < self.reseed_below and self.archive:
            back = self.rng.sample(sorted(self.archive), min(len(self.archive), 2 * self.reseed_below))
            self.archive.difference_update(back)
            self.cold.extend(back)
            self.evict()
        chosen = [self.cold.popleft() for _ in range(min(n, len(self.cold)))]
        need = n - len(chosen)
        if need and self.mode == "mixed":
            chosen += [self.pop_high() for _ in range(min(need // 2, len(self.high)))]
            while len(self.low) > self.low_cap:  # the easiest rows of low move up to high
                neg, _, i = self.take_low(min(range(len(self.low)), key=lambda k: self.low[k][:2]))
                self.seq += 1
                self.high[i] = (-neg, self.seq)
        self.in_flight.update(chosen)
        medium = self.rng.sample(range(len(self.low)), min(n - len(chosen), len(self.low)))
        chosen += [self.low[k][2] for k in medium]
        short = [self.pop_high() for _ in range(min(n - len(chosen), len(self.high)))]  # a low too small
        self.in_flight.update(short)
        chosen += short
        if not chosen:
            raise RuntimeError("the HeaPA pool is empty (every row evicted); raise capacity or reseed_below")
        chosen += [chosen[k % len(chosen)] for k in range(n - len(chosen))]  # a pool smaller than a batch
        return [self.rows[i] for i in chosen]

    def observe(self, groups: list[Group]) -> None:
        self.stats.observe(groups)
        for group in groups:
            i = self.index.get(base_uid(group))
            if i is None:
                continue
            values = self.stats.group_values(group)
            reward = sum(values) / len(values) if values else None
            if self.in_flight[i]:
                self.in_flight[i] -= 1
                if not self.in_flight[i]:
                    del self.in_flight[i]
                if reward is None:
                    self.cold.appendleft(i)
                else:
                    self.insert(i, reward)
            elif reward is not None and i in self.high:
                self.high[i] = (reward, self.high[i][1])
            elif reward is not None:
                self.low = [(-reward, s, j) if j == i else (r, s, j) for r, s, j in self.low]
                heapq.heapify(self.low)
        self.evict()

    def metrics(self) -> dict[str, float]:
        """The pool's partitions (rows cold, low, high, evicted) and the history's summary."""
        return {"sampler/cold": float(len(self.cold)), "sampler/low": float(len(self.low)),
                "sampler/high": float(len(self.high)), "sampler/evicted": float(len(self.archive)),
                **self.stats.summary(len(self.rows))}

    def state_dict(self) -> dict[str, Any]:
        return copy.deepcopy({"rng": self.rng.getstate(), "cold": list(self.cold), "low": self.low, "high": self.high,
                              "in_flight": dict(self.in_flight), "archive": sorted(self.archive), "seq": self.seq,
                              "stats": self.stats.state_dict()})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = copy.deepcopy(state)
        self.rng.setstate(state["rng"])
        self.cold, self.low, self.high = deque(state["cold"]), state["low"], state["high"]
        self.in_flight, self.archive, self.seq = Counter(state["in_flight"]), set(state["archive"]), state["seq"]
        self.stats.load_state_dict(state["stats"])
