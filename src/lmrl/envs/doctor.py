"""A doctor asks a simulated patient questions, then names the diagnosis (ProMed, specs §1.12).

Each task row is a case: the patient's complaint (the opening message), hidden atomic facts with
keywords, the diagnosis and the options to choose from. A reply with a line starting "answer:" is
the final answer (it ends the episode); any other reply is a question (format credit when it starts
with "question:").

Which facts a question reveals is decided by rules, so rewards are reproducible: the facts one of
whose keywords starts a word of the question, not told before, at most `max_facts_per_question`
(atomic questions; asking everything at once reveals no more). The patient says those facts'
sentences, or, with a `user` model, a paraphrase of them in role (the reward still counts the facts
the rules revealed).

Shapley information gain: v(S) = mean token log-prob of the diagnosis given a prompt listing facts
S (a `scorer` model, one no-grad forward per subset, each subset scored once); φ by ProMed's Monte
Carlo permutation rule (`shapley_values`), once per case (cached by row uid); w = softmax(φ/T).
A question revealing facts R has gain g = Σ_{i∈R} w_i. Turn rewards: a question gets
α·g + β·g·1[correct] (+ `format_weight` when the reply starts with "question:" and holds one
marker), the answer γ·1[correct] (+ format). Correctness is known only at the end, so the last Step
re-attributes every turn through `info["turn_rewards"]`; train per turn with
`algo.advantage: turn_discounted`. docs/env_simulated_users.md.
"""
from __future__ import annotations

import math
import random
import re
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from lmrl.algos.logprobs import selected_logprobs
from lmrl.config import TaskConfig
from lmrl.envs.doctor_cases import CASES
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.simulated_user import SimulatedUser, load_local, mentioned_names, normalize
from lmrl.envs.tasks import TASKS, TaskData, split_rows

DOCTOR_SYSTEM = ("You are a doctor talking to a patient. Ask one short question per reply, starting with "
                 "'question:'. When you know the diagnosis, reply 'answer: <diagnosis>', naming one of: {options}. "
                 "You can ask at most {questions} questions.")
PATIENT_SYSTEM = ("You are role-playing a patient (not the doctor). The doctor just asked you a question. Reply as the "
                  "patient, in the first person, in one or two short sentences, telling only this: {told} Do not name "
                  "a diagnosis.")
NOT_SURE = "I'm not sure. I haven't noticed anything like that."
ANSWER = re.compile(r"^\s*answer\s*:(?P<text>.*)", re.IGNORECASE | re.MULTILINE | re.DOTALL)


def shapley_values(n: int, value: Callable[[frozenset], float], max_permutations: int = 50,
                   min_permutations: int = 3, tol: float = 0.01, rng: Any = None) -> tuple[list[float], int]:
    """ProMed's Monte Carlo permutation Shapley values of `n` facts under v = `value` (specs §1.12).

    For t = 1, 2, …: a random permutation adds the facts one by one and each fact's estimate becomes
    φ_i ← ((t−1)/t)·φ_i + (1/t)·(v_j − v_{j−1}); the permutation stops once |v_j − v_full| < tol
    (the facts it did not reach keep their estimate, as in ProMed's cal_shapley.py); sampling stops
    when mean |Δφ| < tol after at least `min_permutations`, or after `max_permutations`. v is
    called once per subset. Returns (φ, the number of permutations used)."""
    cache: dict[frozenset, float] = {}

    def v(subset: frozenset) -> float:
        if subset not in cache:
            cache[subset] = float(value(subset))
        return cache[subset]

    rng = rng or random.Random(0)
    phi = [0.0] * n
    if n == 0:
        return phi, 0
    empty, full = v(frozenset()), v(frozenset(range(n)))
    for t in range(1, max_permutations + 1):
        order = list(range(n))
        rng.shuffle(order)
        before, members, prev = list(phi), set(), empty
        for i in order:
            members.add(i)
            current = v(frozenset(members))
            phi[i] = (t - 1) / t * phi[i] + (current - prev) / t
            prev = current
            if abs(current - full) < tol:
                break
        if t >= min_permutations and sum(abs(a - b) for a, b in zip(phi, before)) / n < tol:
            return phi, t
    return phi, max_permutations


def shapley_weights(phi: list[float], temperature: float = 2.0) -> list[float]:
    """w = softmax(φ / T); uniform for one fact or when all φ are equal."""
    if len(phi) <= 1 or max(phi) - min(phi) < 1e-8:
        return [1.0 / len(phi)] * len(phi) if phi else []
    top = max(phi)
    exps = [math.exp((p - top) / temperature) for p in phi]
    return [e / sum(exps) for e in exps]


def doctor_turn_rewards(turns: list[tuple[str, float, bool]], correct: bool, alpha: float = 2.0, beta: float = 1.0,
                        gamma: float = 3.0, format_weight: float = 1.0) -> list[float]:
    """Each turn's reward from (kind, gain g, well formatted): a "question" gets α·g + β·g·1[correct],
    the "answer" γ·1[correct]; each adds `format_weight` when well formatted."""
    out = []
    for kind, gain, formatted in turns:
        content = alpha * gain + beta * gain * correct if kind == "question" else gamma * correct
        out.append(float(content + format_weight * formatted))
    return out


def revealed_facts(question: str, keywords: list[list[str]], told: set[int], limit: int) -> list[int]:
    """The facts a question asks about: those with a keyword starting a word of the question
    (case-insensitive), not told before, the first `limit` in fact order."""
    words = normalize(question).split()
    asked = [i for i, kws in enumerate(keywords) if i not in told
             and any(w.startswith(normalize(k)) for k in kws for w in words if normalize(k))]
    return asked[:limit]


def well_formatted(reply: str, kind: str) -> bool:
    """The reply starts with "question:" (or "answer:" for the answer) and holds one such marker."""
    text = reply.strip().lower()
    return text.startswith(f"{kind}:") and text.count("question:") + text.count("answer:") == 1


def is_correct(answer: str, gold: str, options: list[str]) -> bool:
    """The answer names the gold diagnosis and no other option."""
    named = mentioned_names([answer], list(dict.fromkeys([*options, gold])))
    return [normalize(n) for n in named] == [normalize(gold)]


def fact_prompt(facts: list[str]) -> str:
    """The prompt of v(S): the facts S, then the question the diagnosis answers."""
    return (f"You are a doctor. Patient information: {' '.join(facts) if facts else 'none'}\n"
            "Question: What is the most likely diagnosis?\nAnswer:")


class AnswerScorer:
    """v(S): the mean token log-prob of an answer after a prompt, from one no-grad forward of a model."""

    def __init__(self, model: Any, tokenizer: Any):
        self.model, self.tokenizer = model, tokenizer

    def __call__(self, prompt: str, answer: str) -> float:
        prompt_ids = self.tokenizer(prompt)["input_ids"]
        answer_ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt_ids + answer_ids], device=device)
        with torch.no_grad():
            logits = self.model(ids).logits[0, len(prompt_ids) - 1:-1]
        logp, _ = selected_logprobs(logits, ids[0, len(prompt_ids):], with_entropy=False)
        return logp.mean().item()


def make_scorer(spec: Any) -> Callable[[str, str], float]:
    """A callable (prompt, answer) -> v as is; a (model, tokenizer) pair, a model path or
    {"model": path, "device": ...} as an in-process `AnswerScorer` (a path shares the user's model)."""
    if isinstance(spec, tuple) and len(spec) == 2:
        return AnswerScorer(*spec)
    if callable(spec):
        return spec
    if isinstance(spec, str):
        return AnswerScorer(*load_local(spec))
    if isinstance(spec, Mapping) and "model" in spec:
        return AnswerScorer(*load_local(str(spec["model"]), spec.get("device", "cpu")))
    raise TypeError(f"doctor scorer: expected a model path, {{'model': path}}, (model, tokenizer) or a callable; "
                    f"got {spec!r:.80}")


def case_row(index: int, case: tuple[str, str, list[tuple[str, str]]], n_options: int = 4) -> dict[str, Any]:
    """A task row of a shipped case; the options are the diagnosis and others drawn with the case index."""
    diagnosis, complaint, facts = case
    others = random.Random(index).sample([c[0] for c in CASES if c[0] != diagnosis], n_options - 1)
    return {"uid": f"doctor-{index}", "question": complaint, "answer": diagnosis,
            "options": sorted([*others, diagnosis]), "facts": [f for f, _ in facts], "keywords": [k.split() for _, k in facts]}


@TASKS.register("doctor", "synthetic patient cases with hidden facts and a diagnosis to find (env.name: doctor)",
                splits_rows=True)
def doctor_task(cfg: TaskConfig) -> TaskData:
    n_options = int(cfg.params.get("options", 4))
    return split_rows([case_row(i, case, n_options) for i, case in enumerate(CASES)], cfg, "doctor")


@ENVIRONMENTS.register("doctor", "ask a simulated patient, then diagnose; ProMed Shapley information-gain turn rewards")
class DoctorEnv:
    """Questions to a rule-bound (optionally model-paraphrased) patient, then a diagnosis."""

    def __init__(self, scorer: Any = "default", user: Any = None, max_turns: int = 6, max_facts_per_question: int = 2,
                 alpha: float = 2.0, beta: float = 1.0, gamma: float = 3.0, format_weight: float = 1.0,
                 temperature: float = 2.0, max_permutations: int = 50, user_max_tokens: int = 48,
                 user_temperature: float = 0.7):
        if max_turns < 1 or max_facts_per_question < 1:
            raise ValueError(f"doctor: need max_turns ≥ 1 and max_facts_per_question ≥ 1 "
                             f"(got {max_turns}, {max_facts_per_question})")
        self.max_turns, self.max_facts = max_turns, max_facts_per_question
        self.weights = {"alpha": alpha, "beta": beta, "gamma": gamma, "format_weight": format_weight}
        self.temperature, self.max_permutations = temperature, max_permutations
        self.scorer = make_scorer(scorer)
        self.user = SimulatedUser.build(user, user_max_tokens, user_temperature) if user else None
        self._phi: dict[str, list[float]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def shapley(self, row: dict[str, Any]) -> list[float]:
        """φ of the case's facts, computed once per row uid (seeded by it, so reproducible); episodes of
        one case wait for the first, different cases compute at once."""
        uid = str(row["uid"])
        with self._lock:
            lock = self._locks.setdefault(uid, threading.Lock())
        with lock:
            if uid not in self._phi:
                facts, gold = row["facts"], " " + row["answer"]
                value = lambda subset: self.scorer(fact_prompt([facts[i] for i in sorted(subset)]), gold)  # noqa: E731
                rng = random.Random(zlib.crc32(uid.encode()))
                self._phi[uid] = shapley_values(len(facts), value, self.max_permutations, rng=rng)[0]
            return self._phi[uid]

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        options = row.get("options") or [row["answer"]]
        system = DOCTOR_SYSTEM.format(options=", ".join(options), questions=max(self.max_turns - 1, 1))
        opening = {"role": "user", "content": row["question"]}
        state = {"row": row, "options": options, "w": shapley_weights(self.shapley(row), self.temperature),
                 "told": set(), "turns": [], "transcript": [opening], "seed": seed}
        return [{"role": "system", "content": system}, opening], state

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        row = state["row"]
        answer = ANSWER.search(reply)
        if answer is not None:
            state["turns"].append(("answer", 0.0, well_formatted(reply, "answer")))
            return self._finish(state, is_correct(answer.group("text"), row["answer"], state["options"]))
        revealed = revealed_facts(reply, row["keywords"], state["told"], self.max_facts)
        state["told"].update(revealed)
        gain = sum(state["w"][i] for i in revealed)
        formatted = well_formatted(reply, "question")
        state["turns"].append(("question", gain, formatted))
        if len(state["turns"]) >= self.max_turns:
            return self._finish(state, False)
        state["transcript"].append({"role": "assistant", "content": reply})
        said = self.patient_says(state, [row["facts"][i] for i in revealed])
        state["transcript"].append({"role": "user", "content": said})
        reward = self.weights["alpha"] * gain + self.weights["format_weight"] * formatted
        return Step([{"role": "user", "content": said}], reward, False, {"metrics": self._metrics(state, False, False)})

    def patient_says(self, state: dict[str, Any], facts: list[str]) -> str:
        """The facts' sentences (or "not sure"), paraphrased by the user model when there is one."""
        plain = " ".join(facts) or NOT_SURE
        if self.user is None:
            return plain
        system = PATIENT_SYSTEM.format(told=plain)
        said = self.user.reply(system, state["transcript"], seed=state["seed"] * 131 + len(state["turns"]))
        return said or plain

    def _finish(self, state: dict[str, Any], correct: bool) -> Step:
        rewards = doctor_turn_rewards(state["turns"], correct, **self.weights)
        answered = state["turns"][-1][0] == "answer"
        return Step(None, rewards[-1], True, {"turn_rewards": rewards,
                                              "metrics": self._metrics(state, correct, answered)})

    def _metrics(self, state: dict[str, Any], correct: bool, answered: bool) -> dict[str, float]:
        turns, facts = state["turns"], state["row"]["facts"]
        return {"env/correct": float(correct), "env/answered": float(answered),
                "env/questions": float(sum(kind == "question" for kind, _, _ in turns)),
                "env/facts_revealed": len(state["told"]) / max(len(facts), 1),
                "env/gain": float(sum(gain for _, gain, _ in turns)),
                "env/format": sum(formatted for _, _, formatted in turns) / len(turns)}
