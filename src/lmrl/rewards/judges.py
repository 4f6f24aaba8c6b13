"""Judge rewards: a language model behind an OpenAI-compatible endpoint scores the completions.

Each is a registered class, built once per run (`cls(**params)`) so its client and cache live
across steps. `judge:` in the params holds the client knobs (`JudgeClient`: base_url, model,
temperature, timeouts, retries, cache…); a test may pass any object with `chat(messages, **kw)` and
`chat_many(conversations, per_call=None, **kw)` instead. A request that fails for good, or a
reply that cannot be parsed, raises `JudgeError`: the scorer then retries the component
(`reward.retries`) and finally excludes the sample or scores it 0 (`reward.on_error`), and counts it.

Per sample (REWARD_FNS): judge_rubric (explicit + variance-aware variants, §1.3),
judge_rubric_implicit (§1.3), judge_flip (§1.6), judge_self_rubric (§1.14).
Per group (GROUP_REWARD_FNS): judge_dynamic_rubric (§1.13), judge_grrm (§1.5), judge_rrc (§1.4).
Formulas and confidence: docs/rewards/judges.md.
"""
from __future__ import annotations

import re
import string
from typing import Any

from lmrl.rewards.compute import GROUP_REWARD_FNS
from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.judge_client import (JudgeClient, JudgeResponseError, json_in, parse_letter_scores, parse_score,
                                       parse_verdict, parse_verdicts, parse_winner, strip_reasoning)
from lmrl.rewards.judge_scoring import (Criterion, break_preference_cycles, overlong_penalty, parse_criteria,
                                        rubric_score, token_f1)
from lmrl.types import Sample

LETTERS = string.ascii_uppercase


# ---------------------------------------------------------------- prompts and shared plumbing

RUBRIC_ONE = ("You grade a response against one criterion.\n\nPrompt:\n{prompt}\n\nResponse:\n{response}\n\n"
              "Criterion: {criterion}\n\nIs the criterion met by the response? "
              "End with 'Verdict: yes' or 'Verdict: no'.")
RUBRIC_ALL = ("You grade a response against numbered criteria.\n\nPrompt:\n{prompt}\n\nResponse:\n{response}\n\n"
              "Criteria:\n{criteria}\n\nFor each criterion answer on its own line '<number>: yes' if the response "
              "meets it, '<number>: no' otherwise.")
IMPLICIT = ("You rate a response under a rubric.\n\nRubric:\n{rubric}\n\nPrompt:\n{prompt}\n\nResponse:\n{response}\n\n"
            "Rate the response from {low} (worst) to {high} (best). End with 'Score: <number>'.")
FLIP = ("Below is a conversation history and an AI response to the user's last message, which is hidden. "
        "Infer that last user instruction.\n\nHistory:\n{history}\n\nResponse:\n{response}\n\n"
        'Answer in JSON: {{"REASONING": "...", "INFERRED INSTRUCTION": "..."}}')
MAKE_RUBRIC = ("Write a rubric for judging responses to the prompt below: the properties a very good response has, "
               "as a short list.\n\nPrompt:\n{prompt}")
DYNAMIC = ("Here are {count} responses to the same prompt.\n\nPrompt:\n{prompt}\n\n{responses}\n\nWrite at most "
           "{max_items} yes/no criteria that separate the better responses from the worse ones, each with a positive "
           'weight for its importance. Answer with a JSON list: [{{"criterion": "...", "weight": 3}}, ...]')
GRRM = ("Here are {count} candidate responses to the same prompt.\n\nPrompt:\n{prompt}\n\n{responses}\n\n"
        "Analyse them, rank them, and give each an integer score from 0 to {max_score}. "
        "The last line must list every score, like 'A: 8, B: 3'.")
# a judge trained by RL (`grrm_rm`) also writes its ranking: what its rows ask, and `judge_grrm`'s `template: ranked`
GRRM_RANKED = ("Here are {count} candidate responses to the same prompt.\n\nPrompt:\n{prompt}\n\n{responses}\n\n"
               "Analyse them, rank them on a line like 'Ranking: B > A = C' (best first, '=' for a tie), and give "
               "each an integer score from 0 to {max_score}. The last line must list every score, like 'A: 8, B: 3'.")
PAIR = ("Which response answers the prompt better?\n\nPrompt:\n{prompt}\n\nResponse A:\n{a}\n\nResponse B:\n{b}\n\n"
        "End with 'Winner: A' or 'Winner: B'.")


def make_judge(judge: Any) -> Any:
    """A `JudgeClient` from a recipe mapping (with `model_path`: a `LocalJudgeClient`, the model generating in
    this process), or the given client-like object unchanged."""
    if isinstance(judge, dict) and "model_path" in judge:
        from lmrl.rewards.local_judge import LocalJudgeClient

        return LocalJudgeClient.from_params(judge)
    if judge is None or isinstance(judge, dict):
        return JudgeClient.from_params(judge)
    if not callable(getattr(judge, "chat", None)):
        raise ValueError(f"judge must be a mapping of client options or have a chat() method (got {judge!r})")
    return judge


def prompt_text(sample: Sample, prompt_field: str = "question") -> str:
    """The instruction the completion answers: the row's last user message, else `row[prompt_field]`."""
    row = sample.row
    users = [m["content"] for m in row.get("messages") or [] if m.get("role") == "user"]
    if users:
        return users[-1]
    if prompt_field not in row:
        raise KeyError(f"judge reward: the task row has no {prompt_field!r} field (keys: {sorted(row)})")
    return str(row[prompt_field])


def _user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def _listing(texts: list[str]) -> str:
    if len(texts) > len(LETTERS):
        raise ValueError(f"a judge call can compare at most {len(LETTERS)} responses (got {len(texts)})")
    return "\n\n".join(f"Response {LETTERS[i]}:\n{t}" for i, t in enumerate(texts))


def grrm_prompt(prompt: str, candidates: list[str], max_score: int = 10, template: str | None = None) -> str:
    """GRRM's judge prompt over `candidates` (Response A, B, …): what `judge_grrm` sends (its template) and what a
    GRRM judge is trained on (`lmrl.data.judge_rows`: the ranked template, the default here)."""
    return (template or GRRM_RANKED).format(count=len(candidates), prompt=prompt, responses=_listing(candidates),
                                            max_score=max_score)


def _check_ask(ask: str) -> bool:
    if ask not in ("per_criterion", "all_at_once"):
        raise ValueError(f"ask must be per_criterion or all_at_once (got {ask!r})")
    return ask == "per_criterion"


class _Judge:
    def __init__(self, judge: Any = None, prompt_field: str = "question", template: str | None = None,
                 default_template: str = ""):
        self.client = make_judge(judge)
        self.prompt_field = prompt_field
        self.template = template or default_template

    def ask_criteria(self, prompt: str, responses: list[str], criteria: list[Criterion],
                     per_criterion: bool) -> list[list[int]]:
        """Met (1) / not met (0) per response and criterion: one call per pair, or one call per response."""
        if per_criterion:
            replies = self.client.chat_many([_user(RUBRIC_ONE.format(prompt=prompt, response=r, criterion=c.text))
                                             for r in responses for c in criteria])
            flat = [parse_verdict(r) for r in replies]
            return [flat[i * len(criteria):(i + 1) * len(criteria)] for i in range(len(responses))]
        listing = "\n".join(f"{i + 1}. {c.text}" for i, c in enumerate(criteria))
        replies = self.client.chat_many([_user(RUBRIC_ALL.format(prompt=prompt, response=r, criteria=listing))
                                         for r in responses])
        return [parse_verdicts(r, len(criteria)) for r in replies]


# ---------------------------------------------------------------- per-sample judges

@REWARD_FNS.register("judge_rubric", "judge checks weighted criteria (pitfalls subtract); explicit or variance-aware")
class RubricReward(_Judge):
    """§1.3 explicit rubric reward, and the variance-aware `complexity` / `hybrid` variants (low confidence)."""

    def __init__(self, criteria: list, judge: Any = None, ask: str = "per_criterion", variant: str = "explicit",
                 beta: float = 0.5, eta: float = 0.5, prompt_field: str = "question"):
        super().__init__(judge, prompt_field)
        self.criteria = parse_criteria(criteria)
        rubric_score([1.0], [1], variant)  # fails now on an unknown variant
        self.per_criterion, self.variant, self.beta, self.eta = _check_ask(ask), variant, beta, eta

    def __call__(self, sample: Sample) -> float:
        met = self.ask_criteria(prompt_text(sample, self.prompt_field), [sample.text], self.criteria,
                                self.per_criterion)[0]
        hits = [int(m == c.satisfied_is_bad) if c.weight < 0 else m for m, c in zip(met, self.criteria)]
        return rubric_score([c.weight for c in self.criteria], hits, self.variant, self.beta, self.eta)


@REWARD_FNS.register("judge_rubric_implicit", "judge gives one holistic score under a rubric, scaled to [0, 1]")
class ImplicitRubricReward(_Judge):
    """§1.3 implicit rubric: the judge sees the whole rubric and gives a Likert score, (s − low) / (high − low)."""

    def __init__(self, rubric: str | list | None = None, judge: Any = None, low: float = 1, high: float = 10,
                 prompt_field: str = "question", template: str | None = None):
        super().__init__(judge, prompt_field, template, IMPLICIT)
        if not rubric or high <= low:
            raise ValueError("judge_rubric_implicit needs a rubric (text or list of criteria) and high > low")
        self.rubric = rubric if isinstance(rubric, str) else "\n".join(f"- {c.text}" for c in parse_criteria(rubric))
        self.low, self.high = low, high

    def score(self, prompt: str, response: str, rubric: str) -> float:
        reply = self.client.chat(_user(self.template.format(rubric=rubric, prompt=prompt, response=response,
                                                            low=self.low, high=self.high)))
        return (parse_score(reply, self.low, self.high) - self.low) / (self.high - self.low)

    def __call__(self, sample: Sample) -> float:
        return self.score(prompt_text(sample, self.prompt_field), sample.text, self.rubric)


@REWARD_FNS.register("judge_self_rubric", "EVOLM: a generated per-prompt rubric, then a holistic judge score")
class SelfRubricReward(ImplicitRubricReward):
    """§1.14 EVOLM policy reward J(y | R): R written once per prompt by `generator` (default: the judge).

    Confidence: low — reconstructed from the abstract; generator co-training is not part of this reward.
    """

    def __init__(self, judge: Any = None, generator: Any = None, low: float = 1, high: float = 10,
                 prompt_field: str = "question", template: str | None = None, rubric_template: str | None = None):
        super().__init__("(generated per prompt)", judge, low, high, prompt_field, template)
        self.generator = self.client if generator is None else make_judge(generator)
        self.rubric_template = rubric_template or MAKE_RUBRIC
        self.rubrics: dict[str, str] = {}

    def rubric_for(self, prompt: str) -> str:
        if prompt not in self.rubrics:
            reply = self.generator.chat(_user(self.rubric_template.format(prompt=prompt)))
            self.rubrics[prompt] = strip_reasoning(reply)
        return self.rubrics[prompt]

    def __call__(self, sample: Sample) -> float:
        prompt = prompt_text(sample, self.prompt_field)
        return self.score(prompt, sample.text, self.rubric_for(prompt))


@REWARD_FNS.register("judge_flip", "FLIP: judge infers the instruction from the response; token F1 with the real one")
class FlipReward(_Judge):
    """§1.6 FLIP: reward = token F1(inferred instruction, real last user message), SQuAD normalisation."""

    def __init__(self, judge: Any = None, prompt_field: str = "question", template: str | None = None):
        super().__init__(judge, prompt_field, template, FLIP)

    @staticmethod
    def inferred_instruction(reply: str) -> str:
        clean = strip_reasoning(reply)
        data = json_in(clean)
        if isinstance(data, dict):
            for key, value in data.items():
                if re.sub(r"[^a-z]", "", str(key).lower()) == "inferredinstruction":
                    return str(value)
        return clean

    def __call__(self, sample: Sample) -> float:
        row = sample.row
        messages = row.get("messages") or []
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
        history = messages[:last_user] if last_user is not None else []
        shown = "\n".join(f"{m['role']}: {m['content']}" for m in history) or "(none)"
        reply = self.client.chat(_user(self.template.format(history=shown, response=sample.text)))
        return token_f1(self.inferred_instruction(reply), prompt_text(sample, self.prompt_field))


# ---------------------------------------------------------------- group judges

@GROUP_REWARD_FNS.register("judge_dynamic_rubric", "DynamicRubric: criteria written for the whole group, then checked")
class DynamicRubricReward(_Judge):
    """§1.13: one call writes weighted yes/no criteria from the group; s_i = Σ_k w_k b_ik / Σ_k w_k.

    Confidence: medium for the aggregation; the evaluator is a fixed judge (its co-training is not recovered).
    """

    def __init__(self, judge: Any = None, max_items: int = 5, ask: str = "all_at_once",
                 prompt_field: str = "question", template: str | None = None):
        super().__init__(judge, prompt_field, template, DYNAMIC)
        self.max_items, self.per_criterion = max_items, _check_ask(ask)

    def items(self, prompt: str, texts: list[str]) -> list[Criterion]:
        reply = self.client.chat(_user(self.template.format(count=len(texts), prompt=prompt, responses=_listing(texts),
                                                            max_items=self.max_items)))
        data = json_in(strip_reasoning(reply))
        try:
            items = parse_criteria(data)[: self.max_items]
        except (ValueError, TypeError, AttributeError):
            raise JudgeResponseError(f"no JSON list of criteria in judge reply {reply[:200]!r}") from None
        if any(c.weight <= 0 for c in items):
            raise JudgeResponseError(f"dynamic rubric weights must be positive: {[c.weight for c in items]}")
        return items

    def __call__(self, samples: list[Sample]) -> list[float]:
        prompt, texts = prompt_text(samples[0], self.prompt_field), [s.text for s in samples]
        items = self.items(prompt, texts)
        weights = [c.weight for c in items]
        return [rubric_score(weights, met) for met in self.ask_criteria(prompt, texts, items, self.per_criterion)]


@GROUP_REWARD_FNS.register("judge_grrm", "GRRM: one judge call ranks and scores the whole group (0-10 each)")
class GrrmReward(_Judge):
    """§1.5 policy reward: r_k = score_k × score_scale − overlong_penalty(len_k); duplicates share a score."""

    def __init__(self, judge: Any = None, score_scale: float = 0.01, max_score: int = 10, max_length: int = 4096,
                 overlong_buffer: int = 2048, overlong_penalty: float = 0.04, default_reward: float = -0.04,
                 on_parse_error: str = "error", prompt_field: str = "question", template: str | None = None):
        super().__init__(judge, prompt_field, GRRM_RANKED if template == "ranked" else template, GRRM)
        if on_parse_error not in ("error", "default"):
            raise ValueError(f"on_parse_error must be error or default (got {on_parse_error!r})")
        self.scale, self.max_score, self.default = score_scale, max_score, default_reward
        self.on_parse_error = on_parse_error
        self.max_length, self.buffer, self.penalty = max_length, overlong_buffer, overlong_penalty

    def __call__(self, samples: list[Sample]) -> list[float]:
        texts = [s.text for s in samples]
        unique = list(dict.fromkeys(t for t in texts if t.strip()))
        if len(unique) < 2:
            return [self.default] * len(samples)
        prompt = prompt_text(samples[0], self.prompt_field)
        reply = self.client.chat(_user(grrm_prompt(prompt, unique, self.max_score, self.template)))
        try:
            scores = parse_letter_scores(reply, LETTERS[: len(unique)], 0, self.max_score)
        except JudgeResponseError:
            if self.on_parse_error == "default":
                return [self.default] * len(samples)
            raise
        letter = {t: LETTERS[i] for i, t in enumerate(unique)}
        return [scores[letter[t]] * self.scale
                - overlong_penalty(s.num_generated, self.max_length, self.buffer, self.penalty)
                if t.strip() else self.default for s, t in zip(samples, texts)]


@GROUP_REWARD_FNS.register("judge_rrc", "RRC: pairwise judge wins against the group (scr) or fixed anchors (agr)")
class RrcReward(_Judge):
    """§1.4: SCR r_i = α Σ_{j≠i} 1[o_i ≻ o_j]; AGR r_i = α Σ_k 1[o_i ≻ a_k]; each pair judged `votes` times.

    Anchors: `row[anchors_field]`, else `num_anchors` replies of `anchor_policy` (a fixed reference
    endpoint), written once per prompt. Odd votes show the pair swapped (position-bias control).
    """

    def __init__(self, judge: Any = None, mode: str = "scr", votes: int = 1, alpha: float = 1.0,
                 swap_positions: bool = True, break_cycles: bool = True, anchors_field: str = "anchors",
                 anchor_policy: Any = None, num_anchors: int = 8, prompt_field: str = "question",
                 template: str | None = None):
        super().__init__(judge, prompt_field, template, PAIR)
        if mode not in ("scr", "agr") or votes < 1:
            raise ValueError(f"judge_rrc: mode must be scr or agr and votes >= 1 (got {mode!r}, {votes})")
        self.mode, self.votes, self.alpha = mode, votes, alpha
        self.swap, self.break_cycles = swap_positions, break_cycles
        self.anchors_field, self.num_anchors = anchors_field, num_anchors
        self.anchor_policy = None if anchor_policy is None else make_judge(anchor_policy)
        self.anchor_cache: dict[str, list[str]] = {}

    def margins(self, prompt: str, pairs: list[tuple[str, str]]) -> list[float]:
        """Votes for the first minus votes for the second response of each pair (identical texts: 0)."""
        jobs, extra, where = [], [], []
        for p, (a, b) in enumerate(pairs):
            for v in range(self.votes if a != b else 0):
                swapped = self.swap and v % 2 == 1
                first, second = (b, a) if swapped else (a, b)
                jobs.append(_user(self.template.format(prompt=prompt, a=first, b=second)))
                extra.append({"seed": v} if self.votes > 1 else {})
                where.append((p, swapped))
        out = [0.0] * len(pairs)
        for (p, swapped), reply in zip(where, self.client.chat_many(jobs, per_call=extra)):
            out[p] += 1.0 if (parse_winner(reply) == "A") != swapped else -1.0
        return out

    def anchors(self, sample: Sample, prompt: str) -> list[str]:
        row = sample.row
        if self.anchors_field in row:
            return [str(a) for a in row[self.anchors_field]]
        if self.anchor_policy is None:
            raise ValueError(f"judge_rrc mode=agr needs anchors: a row field {self.anchors_field!r} or anchor_policy")
        if prompt not in self.anchor_cache:
            seeds = [{"seed": k} for k in range(self.num_anchors)]
            self.anchor_cache[prompt] = self.anchor_policy.chat_many([_user(prompt)] * self.num_anchors, per_call=seeds)
        return self.anchor_cache[prompt]

    def __call__(self, samples: list[Sample]) -> list[float]:
        prompt, texts = prompt_text(samples[0], self.prompt_field), [s.text for s in samples]
        if self.mode == "agr":
            anchors = self.anchors(samples[0], prompt)
            m = self.margins(prompt, [(t, a) for t in texts for a in anchors])
            k = len(anchors)
            return [self.alpha * sum(x > 0 for x in m[i * k:(i + 1) * k]) for i in range(len(texts))]
        index = [(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))]
        margin = [[0.0] * len(texts) for _ in texts]
        for (i, j), x in zip(index, self.margins(prompt, [(texts[i], texts[j]) for i, j in index])):
            margin[i][j], margin[j][i] = x, -x
        if self.break_cycles:
            margin = break_preference_cycles(margin)
        return [self.alpha * sum(x > 0 for x in row) for row in margin]
