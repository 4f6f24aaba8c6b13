"""Abstention evaluation (specs §4.4) and RH cascades (§1.1): coverage, selective accuracy, risk score.

`abstention_eval_metrics(groups, …)` turns scored evaluation groups into `eval/coverage`,
`eval/conditional_accuracy`, … (the outcome of each reply is re-derived from its text with the same
detector as the `abstention` reward). `cascade` / `self_cascade` implement RH inference: ask models
(or the same model again) in order and keep the first reply that does not abstain.

Run as a module to evaluate a recipe's held-out prompts with these metrics (and save the replies), then
to cascade saved replies of several models (most conservative first):

    python -m lmrl.eval.abstention abstention --model RUN/checkpoints/step-000007/model --self-cascade 4 \
        --replies lam2.jsonl
    python -m lmrl.eval.abstention --cascade lam2.jsonl lam0.jsonl --lam 2
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from lmrl.eval.metrics import abstention_metrics
from lmrl.rewards.shaped import DEFAULT_ABSTAIN_PHRASES, abstention_outcome, is_abstention
from lmrl.types import Group

DETECTOR_KEYS = ("phrases", "scope", "pattern", "fallback")


def abstention_eval_metrics(groups: list[Group], lam: float = 1.0, prefix: str = "eval/", **detector) -> dict[str, float]:
    """§4.4 metrics over the first sample of each group (the greedy reply in evaluation).

    `detector` takes the `abstention` reward's params (phrases, scope, pattern, fallback); others are ignored.
    """
    params = {k: v for k, v in detector.items() if k in DETECTOR_KEYS}
    outcomes = [abstention_outcome(g.samples[0], **params) for g in groups if g.samples]
    return {f"{prefix}{k}": v for k, v in abstention_metrics(outcomes, lam).items()}


@dataclass
class CascadeResult:
    reply: str | None  # the first non-abstaining reply; None when every attempt abstained
    index: int | None  # which attempt (model) gave it
    queries: int  # attempts made (the RH cost metric)


def cascade(attempts: Iterable[str | Callable[[], str]], phrases: Sequence[str] = DEFAULT_ABSTAIN_PHRASES,
            scope: str = "answer", pattern: str | None = None) -> CascadeResult:
    """Query in order (RH: models from the most to the least conservative λ) and return the first reply
    that does not abstain. An attempt is a reply or a zero-argument callable producing one; callables are
    only called when reached, so `queries` is the real cost."""
    queries = 0
    for index, attempt in enumerate(attempts):
        reply = attempt() if callable(attempt) else attempt
        queries += 1
        if not is_abstention(reply, phrases, scope, pattern):
            return CascadeResult(reply, index, queries)
    return CascadeResult(None, None, queries)


def self_cascade(generate: Callable[[], str], max_attempts: int, **detector) -> CascadeResult:
    """RH self-cascading: sample the same model again while it abstains, at most `max_attempts` times."""
    if max_attempts < 1:
        raise ValueError(f"self_cascade needs max_attempts >= 1, got {max_attempts}")
    return cascade((generate for _ in range(max_attempts)), **detector)


def batched_self_cascade(groups: list[Group], draw: Callable[[list[dict]], list], max_attempts: int,
                         **detector) -> tuple[list, list[int]]:
    """Self-cascading over a whole evaluation: the rows whose current reply abstains are re-sampled
    together (`draw(rows) -> one Sample per row`), at most `max_attempts` replies per row in all.
    Returns the final sample of each group and the number of queries it took."""
    params = {k: v for k, v in detector.items() if k in ("phrases", "scope", "pattern")}
    finals = [g.samples[0] for g in groups]
    queries = [1] * len(groups)
    for _ in range(max_attempts - 1):
        todo = [i for i, x in enumerate(finals) if is_abstention(x.text, **params)]
        if not todo:
            break
        for i, x in zip(todo, draw([groups[i].row for i in todo])):
            finals[i] = x
            queries[i] += 1
    return finals, queries


def reply_rows(groups: list[Group], **detector) -> list[dict]:
    """One JSON-able row per evaluated prompt: uid, question, gold, greedy reply and its outcome."""
    params = {k: v for k, v in detector.items() if k in DETECTOR_KEYS}
    return [{"uid": g.uid, "question": g.row.get("question"), "gold": str(g.row.get("answer")),
             "text": g.samples[0].text, "outcome": abstention_outcome(g.samples[0], **params)}
            for g in groups if g.samples]


def cascade_metrics(replies_per_model: list[list[dict]], lam: float, **detector) -> dict[str, float]:
    """RH cascade over saved replies (`reply_rows`), models in query order: per prompt the first reply
    that does not abstain decides; avg_queries counts the models asked. Prompts are matched by uid."""
    if not replies_per_model:
        raise ValueError("cascade_metrics needs the replies of at least one model")
    params = {k: v for k, v in detector.items() if k in ("phrases", "scope", "pattern")}
    by_uid = [{r["uid"]: r for r in rows} for rows in replies_per_model]
    uids = [r["uid"] for r in replies_per_model[0] if all(r["uid"] in m for m in by_uid)]
    if not uids:
        raise ValueError("the saved replies share no prompt uid")
    outcomes, queries = [], []
    for uid in uids:
        result = cascade([m[uid]["text"] for m in by_uid], **params)
        outcomes.append("abstain" if result.index is None else by_uid[result.index][uid]["outcome"])
        queries.append(result.queries)
    metrics = {f"cascade/{k}": v for k, v in abstention_metrics(outcomes, lam).items()}
    metrics.update({"cascade/avg_queries": sum(queries) / len(queries), "cascade/num_prompts": float(len(uids))})
    return metrics


def abstention_params(cfg) -> dict:
    """The first `abstention` component's params in a config (lam and the detector)."""
    for c in cfg.reward.components:
        if c.name == "abstention":
            return dict(c.params)
    return {}


def main(argv: list[str] | None = None) -> int:
    """Greedy held-out evaluation with §4.4 metrics, then optional self-cascading of the abstentions."""
    import torch

    from lmrl.engines import SamplingParams
    from lmrl.envs import rollout
    from lmrl.envs.pieces import build_pieces
    from lmrl.eval.evaluator import evaluate
    from lmrl.loading import load_config
    from lmrl.rewards import RewardScorer

    p = argparse.ArgumentParser(prog="python -m lmrl.eval.abstention", description=main.__doc__)
    p.add_argument("recipe", nargs="?")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--replies", help="write the greedy replies and their outcomes here (JSON lines)")
    p.add_argument("--cascade", nargs="+", metavar="REPLIES", help="cascade saved replies, most conservative first")
    p.add_argument("--model", help="model directory, .gguf file or 'default'")
    p.add_argument("--self-cascade", type=int, default=1, help="attempts per prompt while the model abstains")
    p.add_argument("--lam", type=float, help="λ of the risk score (default: the recipe's abstention lam)")
    args = p.parse_args(argv)
    if args.cascade:
        files = [[json.loads(line) for line in open(path) if line.strip()] for path in args.cascade]
        print(json.dumps(cascade_metrics(files, args.lam if args.lam is not None else 1.0), indent=1))
        return 0
    if not args.recipe:
        p.error("a recipe is needed (or --cascade REPLIES...)")
    overrides = list(args.overrides) + ([f"model.path={args.model}"] if args.model else [])
    cfg = load_config(args.recipe, overrides)
    params = abstention_params(cfg)
    lam = args.lam if args.lam is not None else float(params.get("lam", 1.0))
    params = {k: v for k, v in params.items() if k in DETECTOR_KEYS}
    pieces = build_pieces(cfg)
    engine, tokenizer = pieces.engine, pieces.tokenizer
    metrics, groups = evaluate(engine, tokenizer, pieces.eval_rows, RewardScorer(cfg.reward), cfg.eval,
                               cfg.rollout.max_new_tokens, cfg.reward.accuracy_component, seed=cfg.trainer.seed)
    metrics.update(abstention_eval_metrics(groups, lam, **params))
    if args.replies:
        with open(args.replies, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in reply_rows(groups, **params))
    if args.self_cascade > 1:
        sampling = SamplingParams(max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                                  temperature=cfg.eval.temperature)
        gen = torch.Generator().manual_seed(cfg.trainer.seed)

        def draw(rows: list[dict]) -> list:
            return [g.samples[0] for g in rollout(engine, tokenizer, rows, 1, sampling, gen)]

        finals, queries = batched_self_cascade(groups, draw, args.self_cascade, **params)
        final_groups = [Group(g.uid, g.row, [x]) for g, x in zip(groups, finals)]
        metrics.update(abstention_eval_metrics(final_groups, lam, prefix="eval/self_cascade/", **params))
        metrics["eval/self_cascade/avg_queries"] = sum(queries) / len(queries)
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
