"""TLPO's token pairs, mined from the policy's own rollouts each step (`batches.source=token_pairs`).

TLPO (docs/methods/tlpo.md) — confidence: low — reconstructed from the abstract. For each rollout:

1. Error positions E (`error_positions`): the language of each completion token by Unicode script
   (`rewards.language_id.token_scripts`, a deterministic stand-in for a language identifier); with
   `error: span_start` (default) E holds the first token of each wrong-language span that follows
   target-language text (or opens the reply), with `error: every` every wrong-language token.
   Tokens without letters (spaces, digits, punctuation) are neutral: they neither open nor close a span.
2. Alternatives (`best_alternative`): the policy's top-k next tokens at t (k = 5); each is continued
   greedily for up to m tokens (m = 8) and passes when that text has letters of the target script only.
   a⁺ is the most probable passing candidate other than the erroneous token e itself.
3. Each position with an a⁺ becomes one group of two rows sharing the prompt and the prefix y_<t: chosen
   y_<t a⁺ and rejected y_<t e, each with a loss mask on its last token only. The `dpo` term on them is
   token-DPO and the `unlikelihood` term −log(1 − π(e)) (`algos.token_level`); nothing else is trained.

Positions with no passing candidate make no pair (counted in `tlpo/no_alternative`). The probe that asks the
policy for its top-k tokens and greedy continuations is `ModelProbe` (the learner's model, in eval mode,
without gradient); tests give their own.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import torch

from lmrl.rewards.language_id import in_script, target_script, token_scripts
from lmrl.types import Group, Sample

ERROR_MODES = ("span_start", "every")


class PolicyProbe(Protocol):
    def top_k(self, ids: list[int], k: int) -> list[tuple[int, float]]:
        """The k most probable next tokens after `ids` with their log-probs, most probable first."""

    def greedy(self, prefixes: list[list[int]], m: int) -> list[list[int]]:
        """Up to m greedy tokens after each of `prefixes` (all of one length), cut after an end of sequence."""


@dataclass(frozen=True)
class TokenPairParams:
    """`batches.params` of the token pair source."""

    k: int = 5  # candidates per error position (the policy's top-k)
    m: int = 8  # greedy continuation tokens each candidate is checked with
    error: str = "span_start"  # span_start | every
    lang: str | None = None  # the target language (a code such as "en", or a script); else the row's field
    lang_field: str = "target_lang"
    max_positions: int = 4  # error positions per rollout, the first ones (each costs k continuations)

    def __post_init__(self):
        if self.error not in ERROR_MODES:
            raise ValueError(f"batches.params.error={self.error!r}: use one of {list(ERROR_MODES)}")
        if self.k < 1 or self.m < 1 or self.max_positions < 1:
            raise ValueError(f"batches.params k, m and max_positions must be >= 1 (got {self.k}, {self.m}, "
                             f"{self.max_positions})")

    @staticmethod
    def of(params: dict) -> "TokenPairParams":
        """From `batches.params`; a key it does not know is refused, naming the ones it does."""
        known = set(TokenPairParams.__dataclass_fields__)
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"batches.params {unknown}: batches.source=token_pairs reads only {sorted(known)}")
        return TokenPairParams(**params)

    def target(self, row: dict) -> str:
        """The target script of a row's replies."""
        lang = self.lang or row.get(self.lang_field)
        if not lang:
            raise ValueError(f"batches.source=token_pairs needs the target language: set batches.params.lang or "
                             f"give every task row a {self.lang_field!r} field (batches.params.lang_field)")
        return target_script(lang)


def error_positions(scripts: list[frozenset[str]], target: str, error: str = "span_start") -> list[int]:
    """E over the tokens' scripts: every token with a letter outside `target` (`every`), or only the first of
    each such span after target-language text or at the reply's start (`span_start`)."""
    wrong = [bool(s) and s != {target} for s in scripts]
    if error == "every":
        return [t for t, w in enumerate(wrong) if w]
    out, after_target = [], True
    for t, s in enumerate(scripts):
        if not s:
            continue
        if wrong[t] and after_target:
            out.append(t)
        after_target = not wrong[t]
    return out


def best_alternative(prefix: list[int], error_token: int, probe: PolicyProbe, tokenizer, target: str, k: int,
                     m: int) -> tuple[int, float] | None:
    """(a⁺, log π(a⁺)): the most probable of the top-k candidates other than `error_token` whose text with its
    greedy continuation has letters, all of the `target` script; None when none does."""
    candidates = [(a, lp) for a, lp in probe.top_k(prefix, k) if a != error_token]
    if not candidates:
        return None
    continuations = probe.greedy([prefix + [a] for a, _ in candidates], m)
    for (a, lp), more in zip(candidates, continuations):
        if in_script(tokenizer.decode([a] + list(more)), target):
            return a, lp
    return None


def token_pair(sample: Sample, t: int, alternative: tuple[int, float], uid: str) -> Group:
    """The group [chosen y_<t a⁺, rejected y_<t e] of one error position, each trained on its last token."""
    prefix, logps = sample.completion_ids[:t], sample.behaviour_logprobs[:t]
    versions = sample.policy_version[: t + 1] if sample.policy_version else []
    mask = [0] * t + [1]

    def row(token: int, logp: float, label: str) -> Sample:
        return Sample(prompt_ids=list(sample.prompt_ids), completion_ids=prefix + [token],
                      behaviour_logprobs=logps + [logp], finish_reason="length", policy_version=list(versions),
                      rewards=dict(sample.rewards), reward=sample.reward,
                      info={"preference": label, "error_position": t}, origin=sample.origin, loss_mask=list(mask),
                      text=sample.text, row=sample.row)

    a, lp = alternative
    return Group(uid, sample.row, [row(a, lp, "chosen"),
                                   row(sample.completion_ids[t], sample.behaviour_logprobs[t], "rejected")])


def mine_token_pairs(groups: list[Group], probe: PolicyProbe, tokenizer, params: TokenPairParams
                     ) -> tuple[list[Group], dict[str, float]]:
    """Every rollout's token pairs (one group each) and the metrics: error positions found, pairs made, positions
    without a passing alternative, positions past a reply's `max_positions` (not probed), the share of rollouts
    with an error. Found = pairs + without an alternative + past the cap."""
    out: list[Group] = []
    found = missing = over_cap = with_error = rollouts = 0
    for g in groups:
        target = params.target(g.row)
        for i, x in enumerate(g.scored):
            rollouts += 1
            trained = x.loss_mask or [1] * len(x.completion_ids)
            positions = [t for t in error_positions(token_scripts(x.completion_ids, tokenizer), target, params.error)
                         if trained[t]]
            with_error += bool(positions)
            found += len(positions)
            over_cap += max(len(positions) - params.max_positions, 0)
            for t in positions[: params.max_positions]:
                alternative = best_alternative(list(x.prompt_ids) + x.completion_ids[:t], x.completion_ids[t], probe,
                                               tokenizer, target, params.k, params.m)
                if alternative is None:
                    missing += 1
                    continue
                out.append(token_pair(x, t, alternative, f"{g.uid}/{i}@{t}"))
    return out, {"tlpo/error_positions": float(found), "tlpo/pairs": float(len(out)),
                 "tlpo/no_alternative": float(missing), "tlpo/over_max_positions": float(over_cap),
                 "tlpo/rollouts_with_error": with_error / rollouts if rollouts else 0.0}


@contextlib.contextmanager
def evaluating(model):
    """`model` in eval mode (no dropout) for the block, then back in the mode it was in."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


class ModelProbe:
    """The policy itself as a `PolicyProbe`: a causal LM's next-token log-probs and greedy continuations."""

    def __init__(self, model, device, eos_token_id: int | None, temperature: float = 1.0):
        self.model, self.device, self.eos, self.temperature = model, device, eos_token_id, temperature

    @torch.no_grad()
    def top_k(self, ids: list[int], k: int) -> list[tuple[int, float]]:
        with evaluating(self.model):
            logits = self.model(torch.tensor([ids], device=self.device)).logits[0, -1].float() / self.temperature
        top = torch.log_softmax(logits, dim=-1).topk(k)
        return list(zip(top.indices.tolist(), top.values.tolist()))

    @torch.no_grad()
    def greedy(self, prefixes: list[list[int]], m: int) -> list[list[int]]:
        ids = torch.tensor(prefixes, device=self.device)
        with evaluating(self.model):
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=m, do_sample=False,
                                      pad_token_id=self.eos if self.eos is not None else 0)[:, ids.shape[1]:].tolist()
        return [row[: row.index(self.eos)] if self.eos in row else row for row in out]
