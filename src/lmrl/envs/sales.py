"""A salesperson and a simulated shopper (SalesSim, specs §1.18), rewarded by decision alignment.

The policy is the salesperson of a small electronics shop (`CATALOGUE`, shown in its system
prompt). The shopper is a simulated user (`envs.simulated_user`) with a persona: a category, a
budget, a must-have feature, and a hidden list of acceptable products (the catalogue's products that
fit all three). The shopper ends the conversation by writing `BUY: <product>` or `LEAVE`; after
`max_turns` salesperson turns without a decision it has left.

Reward, on the last turn: r = w_DA·DA + w_Q·quality + w_sale·1[an acceptable product bought]. DA is
SalesSim's decision alignment
(`decision_alignment`, confidence high: the rule of SalesSim's grader); quality is an optional
judge's 1–10 rating of the salesperson's turns mapped to [0, 1] (off by default: w_Q = 0). The
weighting follows UserGRPO's multi-objective reward as inferred from its abstract: confidence LOW,
the weights are knobs, not the authors' values. SalesSim trains the shopper; with the salesperson as
the policy, DA alone pays as much for recommending nothing (the shopper leaves) as for a fitting
sale, so `w_sale` (off by default; 1 in the `sales` recipe) adds the sale itself.
docs/env_simulated_users.md.
"""
from __future__ import annotations

import random
import re
from typing import Any

from lmrl.config import TaskConfig
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.simulated_user import SimulatedUser, mentioned_names, normalize
from lmrl.envs.tasks import TASKS, TaskData
from lmrl.rewards import REWARD_FNS
from lmrl.rewards.judge_client import JudgeClient, parse_score

# no name contains another, so a product mentioned by name is never mistaken for a second one
CATALOGUE = [
    {"name": "Aria Buds", "category": "headphones", "price": 59, "features": ["wireless", "water resistant"]},
    {"name": "Nimbus Over-Ear", "category": "headphones", "price": 149,
     "features": ["wireless", "noise cancelling", "long battery"]},
    {"name": "Studio Wire", "category": "headphones", "price": 39, "features": ["wired", "long battery"]},
    {"name": "Quiet Pods", "category": "headphones", "price": 199,
     "features": ["wireless", "noise cancelling", "water resistant"]},
    {"name": "Pulse Band", "category": "smartwatch", "price": 49, "features": ["fitness tracking", "long battery"]},
    {"name": "Orbit Watch", "category": "smartwatch", "price": 249,
     "features": ["gps", "fitness tracking", "water resistant"]},
    {"name": "Tempo Watch", "category": "smartwatch", "price": 129,
     "features": ["fitness tracking", "water resistant"]},
    {"name": "Summit GPS", "category": "smartwatch", "price": 329,
     "features": ["gps", "long battery", "water resistant"]},
    {"name": "Feather 13", "category": "laptop", "price": 899, "features": ["lightweight", "long battery"]},
    {"name": "Forge 16", "category": "laptop", "price": 1499, "features": ["gaming", "large screen"]},
    {"name": "Scholar 14", "category": "laptop", "price": 549, "features": ["long battery"]},
    {"name": "Canvas Pro", "category": "laptop", "price": 1299, "features": ["lightweight", "large screen"]},
]
NAMES = ["Maya", "Tom", "Ines", "Ravi", "Lena", "Omar", "Sofia", "Ken", "Ada", "Luis", "Mei", "Jonas"]
BACKGROUNDS = ["a nurse who works night shifts", "a student on a tight budget", "a retired teacher",
               "a software developer", "a marathon runner", "a parent of two small children",
               "a travelling sales consultant", "a graphic designer"]
SALES_SYSTEM = ("You are a salesperson in an electronics shop. Help the shopper find a product that suits them: ask "
                "about their needs and recommend products from the catalogue by name. Keep replies short.\n"
                "Catalogue:\n{catalogue}")
SHOPPER_SYSTEM = ("You are role-playing a shopper talking to a salesperson. You are {name}, {age}, {background}. "
                  "You want {wanted} for at most ${budget}, and it must be {must_have}. The only "
                  "products you would buy are: {acceptable_list}. Reply in one or two short sentences and stay in "
                  "character. When you have decided, end the conversation: write 'BUY: <product name>' to buy a "
                  "product the salesperson offered, or 'LEAVE' to leave without buying.")
JUDGE_PROMPT = ("Rate the salesperson in this shop conversation for helpfulness, honesty and natural, fluent "
                "language, from 1 (poor) to 10 (excellent). Reply with 'Score: <number>'.\n\n{conversation}")
DECISION = re.compile(r"\bBUY:[ \t]*(?P<product>[^\n]*)|\bLEAVE\b")


def names_match(a: str, b: str) -> bool:
    """SalesSim's fuzzy/subset product match: case-insensitive, one name contained in the other."""
    a, b = normalize(a), normalize(b)
    return bool(a and b) and (a in b or b in a)


def decision_alignment(recommended: list[str] | set[str], acceptable: list[str] | set[str], purchased: str | None,
                       turns: int) -> float:
    """SalesSim's decision alignment (specs §1.18): 1.0 when the shopper's decision fits its persona.

    Aligned iff (a) the purchase matches a product the salesperson recommended and an acceptable
    product, or (b) nothing was bought and no acceptable product was ever recommended. A conversation
    of one turn (a premature ending) is never aligned."""
    if turns <= 1:
        return 0.0
    if purchased:
        offered = any(names_match(purchased, r) for r in recommended)
        return float(offered and any(names_match(purchased, a) for a in acceptable))
    return float(not any(names_match(r, a) for r in recommended for a in acceptable))


def parse_decision(text: str) -> tuple[str, str | None] | None:
    """("buy", product) or ("leave", None) for the first `BUY: <product>` / `LEAVE` in the shopper's
    message (upper case, as instructed, so "I'll leave it" is no decision); None while undecided."""
    found = DECISION.search(text)
    if found is None:
        return None
    product = (found.group("product") or "").strip().strip(".!,;:\"'*` ")
    return ("buy", product) if found.group(0).startswith("BUY") and product else ("leave", None)


def make_persona(seed: int) -> dict[str, Any]:
    """A shopper drawn from `seed`: name, age, background, wanted category, budget, must-have feature,
    and the acceptable products (that category, within budget, with the feature; possibly none)."""
    rng = random.Random(seed)
    category = rng.choice(sorted({p["category"] for p in CATALOGUE}))
    items = [p for p in CATALOGUE if p["category"] == category]
    must_have = rng.choice(sorted({f for p in items for f in p["features"]}))
    budget = rng.choice(sorted(p["price"] for p in items)) + rng.choice([0, 10, 50])
    acceptable = [p["name"] for p in items if p["price"] <= budget and must_have in p["features"]]
    return {"name": rng.choice(NAMES), "age": rng.randint(19, 75), "background": rng.choice(BACKGROUNDS),
            "category": category, "budget": budget, "must_have": must_have, "acceptable": acceptable}


def over_disclosure(first_reply: str, persona: dict[str, Any]) -> float:
    """UserGRPO's over-disclosure O: the share of the persona's three criteria (category, budget, must-have feature)
    the shopper states in its first reply to the salesperson (its scripted opening names the category only)."""
    said = f" {normalize(first_reply)} "
    category = persona["category"].rstrip("s")
    stated = [f" {category}" in said, str(persona["budget"]) in said, f" {normalize(persona['must_have'])} " in said]
    return sum(stated) / 3


@REWARD_FNS.register("shopper_fidelity", "a trained shopper's reward: w_da·DA + w_q·Q − w_o·O of its episode (sales)")
def shopper_fidelity(sample, w_da: float = 1.0, w_q: float = 0.0, w_o: float = 0.0) -> float | None:
    """UserGRPO's reward of the shopper simulator (specs tasks_and_roles §C1; confidence low for the objective):
    r = w_DA·DA + w_Q·Q − w_O·O of the episode the sample's turn belongs to: decision alignment, the judge's
    quality (the `sales` environment's `judge`; w_q > 0 needs it), over-disclosure. Its row is the episode's state
    (`envs.roles`); None (excluded) for a turn of an episode that never ended (cut at the token budget)."""
    outcome = sample.row.get("outcome")
    if outcome is None:
        return None
    if w_q and outcome["quality"] is None:
        raise ValueError("shopper_fidelity: w_q > 0 needs the sales environment's judge (env.params.judge, w_quality)")
    return w_da * outcome["aligned"] + w_q * (outcome["quality"] or 0.0) - w_o * outcome["over_disclosure"]


def opening_line(persona: dict[str, Any]) -> str:
    return f"Hi, I'm {persona['name']}. I'm looking for {_wanted(persona['category'])}."


def _wanted(category: str) -> str:
    """The category with its article: "a laptop", "headphones"."""
    return category if category.endswith("s") else f"a {category}"


@TASKS.register("sales", "simulated shoppers with hidden acceptable products, seeded personas (env.name: sales)")
def sales_task(cfg: TaskConfig) -> TaskData:
    rows = []
    for i in range(cfg.num_train + cfg.num_eval):
        persona = make_persona(cfg.seed * 1_000_003 + i)
        rows.append({"uid": f"sales-{i}", "question": opening_line(persona), "answer": "", "persona": persona})
    return TaskData(rows[: cfg.num_train], rows[cfg.num_train:])


@ENVIRONMENTS.register("sales", "sell to a simulated shopper; SalesSim decision-alignment reward (+ optional judge)")
class SalesEnv:
    """The policy sells; a simulated shopper (built once, shared by all episodes) buys or leaves."""

    def __init__(self, user: Any = None, max_turns: int = 4, user_max_tokens: int = 64, user_temperature: float = 0.7,
                 w_da: float = 1.0, w_quality: float = 0.0, judge: dict[str, Any] | None = None, w_sale: float = 0.0):
        if max_turns < 2:
            raise ValueError(f"sales: max_turns must be ≥ 2 (a one-turn conversation is never aligned), got {max_turns}")
        if w_quality and not judge:
            raise ValueError("sales: w_quality > 0 needs a judge (a JudgeClient mapping: {base_url, model, ...})")
        self.max_turns, self.w_da, self.w_quality, self.w_sale = max_turns, w_da, w_quality, w_sale
        self.user = SimulatedUser.build(user or {"model": "default"}, user_max_tokens, user_temperature)
        self.judge = JudgeClient.from_params(judge) if judge and w_quality else None
        self.names = [p["name"] for p in CATALOGUE]
        lines = [f"- {p['name']}: {p['category']}, ${p['price']}, {', '.join(p['features'])}" for p in CATALOGUE]
        self.system = SALES_SYSTEM.format(catalogue="\n".join(lines))

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        persona = row.get("persona") or make_persona(seed)
        opening = {"role": "user", "content": opening_line(persona)}
        state = {"persona": persona, "transcript": [opening], "turns": 0, "seed": seed, "uid": row.get("uid", "")}
        return [{"role": "system", "content": self.system}, opening], state

    def shopper_prompt(self, persona: dict[str, Any]) -> str:
        acceptable = ", ".join(persona["acceptable"]) or "none of this shop's products"
        return SHOPPER_SYSTEM.format(**persona, wanted=_wanted(persona["category"]), acceptable_list=acceptable)

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        state["turns"] += 1
        state["transcript"].append({"role": "assistant", "content": reply})
        said = self.user.reply(self.shopper_prompt(state["persona"]), state["transcript"],
                               seed=state["seed"] * 131 + state["turns"], row=state, group=state["uid"])
        state["transcript"].append({"role": "user", "content": said})
        decision = parse_decision(said)
        if decision is None and state["turns"] < self.max_turns:
            return Step([{"role": "user", "content": said}], 0.0, False)
        return self._finish(state, decision)

    def _finish(self, state: dict[str, Any], decision: tuple[str, str | None] | None) -> Step:
        persona, turns = state["persona"], state["turns"]
        purchased = decision[1] if decision else None
        pitches = [m["content"] for m in state["transcript"] if m["role"] == "assistant"]
        recommended = mentioned_names(pitches, self.names)  # the products the salesperson named
        acceptable = persona["acceptable"]
        da = decision_alignment(recommended, acceptable, purchased, turns)
        good_buy = bool(purchased) and any(names_match(purchased, a) for a in acceptable)
        metrics = {"env/aligned": da, "env/decided": float(decision is not None), "env/bought": float(bool(purchased)),
                   "env/bought_acceptable": float(good_buy),
                   "env/recommended": float(len(recommended)),
                   "env/recommended_acceptable": float(any(names_match(r, a) for r in recommended for a in acceptable))}
        reward = self.w_da * da + self.w_sale * good_buy
        quality = None
        if self.judge is not None:
            metrics["env/quality"] = quality = self.quality(state["transcript"])
            reward += self.w_quality * quality
        said = [m["content"] for m in state["transcript"] if m["role"] == "user"]
        metrics["env/over_disclosure"] = disclosed = over_disclosure(said[1] if len(said) > 1 else "", persona)
        # what a trained shopper's reward reads (`shopper_fidelity`): its samples' row is this episode's state
        state["outcome"] = {"aligned": da, "quality": quality, "over_disclosure": disclosed, "turns": turns}
        return Step(None, reward, True, {"metrics": metrics})

    def quality(self, transcript: list[dict[str, str]]) -> float:
        """The judge's 1–10 rating of the salesperson, mapped to [0, 1]."""
        conversation = "\n".join(f"{'Salesperson' if m['role'] == 'assistant' else 'Shopper'}: {m['content']}"
                                 for m in transcript)
        score = parse_score(self.judge.chat([{"role": "user", "content": JUDGE_PROMPT.format(
            conversation=conversation)}]), 1, 10)
        return (score - 1) / 9
