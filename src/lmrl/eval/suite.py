"""The evaluation suite behind `lmrl eval`: what a model does on the held-out prompts, prompt by prompt.

Each prompt gets one greedy reply and `eval.samples` sampled ones. Everything is kept as one record
per prompt (correctness, answers, lengths, entropies, confidence, abstention), and every metric is
computed from those records (`prompt_values`, then `combine`), so `lmrl compare` can resample prompts
and recompute the same numbers (formulas: docs/eval.md). The result is one JSON document: settings,
metrics, the prompts nothing solved, and the records.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from lmrl.config import Config, ConfigError, EnvConfig, EvalConfig
from lmrl.eval.abstention import DETECTOR_KEYS, abstention_params
from lmrl.eval.evaluator import correct_flags, episode_metrics, held_out_replies, reward_metrics
from lmrl.eval.metrics import (abstention_metrics, across_tasks, distinct_n, expected_calibration_error, majority, pass_at_k,
                               risk_coverage)
from lmrl.eval.suite_report import json_safe
from lmrl.loading import load_config
from lmrl.rewards.gaming import restated_question
from lmrl.rewards.group import answer_classes, sample_answer
from lmrl.rewards.shaped import is_abstention
from lmrl.types import Group, Sample

FORMAT = 1  # version of the JSON layout
REPLY_CHARS = 1000  # greedy reply kept per prompt


def _entropy(sample: Sample) -> float:
    """Mean −log p of the policy's sampled tokens (environment tokens carry log-prob 0)."""
    return -sum(sample.behaviour_logprobs) / max(sample.num_generated, 1)


def prompt_record(greedy: Group, sampled: Group, accuracy_component: str, detector: dict | None = None) -> dict:
    """The JSON record of one prompt: its greedy reply and its sampled replies, reduced to what the metrics need."""
    g = greedy.samples[0]
    g_correct = correct_flags([greedy], accuracy_component)[0][0]
    params = {k: v for k, v in (detector or {}).items() if k in ("phrases", "scope", "pattern")}
    outcome = "abstain" if is_abstention(g.text, **params) else "correct" if g_correct else "wrong"
    texts = [s.text for s in sampled.samples]
    return {
        "uid": greedy.uid, "question": greedy.row.get("question"), "gold": str(greedy.row.get("answer")),
        "greedy_correct": g_correct, "greedy_outcome": outcome, "greedy_length": g.num_generated,
        "greedy_prob": math.exp(-_entropy(g)), "greedy_restated": g_correct and restated_question(g),
        "reply": g.text[:REPLY_CHARS],
        "correct": correct_flags([sampled], accuracy_component)[0],
        "answers": answer_classes([sample_answer(s, fallback="last_number") for s in sampled.samples]),
        "lengths": [s.num_generated for s in sampled.samples],
        "entropy": [_entropy(s) for s in sampled.samples],
        "truncated": [s.finish_reason == "length" for s in sampled.samples],
        "distinct_1": distinct_n(texts, 1), "distinct_2": distinct_n(texts, 2),
    }


def ks_for(records: list[dict], ks: Sequence[int]) -> list[int]:
    """The k of pass@k: 1, the asked ones that the sample count n allows, and n (maj@k: those >= 2)."""
    n = min(len(r["correct"]) for r in records)
    return sorted({k for k in ks if 1 <= k <= n} | {1, n})


def prompt_values(record: dict, ks: Sequence[int]) -> dict:
    """The numbers of one prompt that every metric is a function of (pass@k and maj@k for the given k)."""
    n, c = len(record["correct"]), sum(record["correct"])
    right, agreement = majority(record["answers"], record["correct"])
    return {
        "uid": record["uid"], "greedy_correct": float(record["greedy_correct"]), "greedy_prob": record["greedy_prob"],
        "outcome": record["greedy_outcome"], "greedy_length": record["greedy_length"],
        "restated": record["greedy_restated"], "distinct_1": record["distinct_1"], "distinct_2": record["distinct_2"],
        "pass": {k: pass_at_k(n, c, k) for k in ks if k <= n},
        "maj": {k: float(majority(record["answers"][:k], record["correct"][:k])[0]) for k in ks if 2 <= k <= n},
        "majority_correct": right, "agreement": agreement, "samples": n, "lengths": record["lengths"],
        "length_sum": float(sum(record["lengths"])), "entropy_sum": float(np.dot(record["entropy"], record["lengths"])),
        "truncated": sum(record["truncated"]),
    }


def combine(values: list[dict], lam: float = 1.0, bins: int = 10) -> dict[str, float]:
    """Every suite metric from per-prompt values (`prompt_values`); `lmrl compare` resamples these."""
    def mean(key: str) -> float:
        return float(np.mean([v[key] for v in values]))

    out = {"accuracy": mean("greedy_correct")}
    for k in values[0]["pass"]:  # pass@1 is avg@n, the mean over prompts of c/n
        out[f"pass@{k}"] = float(np.mean([v["pass"][k] for v in values]))
    for k in values[0]["maj"]:
        out[f"maj@{k}"] = float(np.mean([v["maj"][k] for v in values]))
    out["distinct_1"], out["distinct_2"] = mean("distinct_1"), mean("distinct_2")
    greedy = [v["greedy_correct"] for v in values]
    out["ece_greedy_prob"] = expected_calibration_error([v["greedy_prob"] for v in values], greedy, bins)
    if values[0]["samples"] >= 2:
        right, agreement = [v["majority_correct"] for v in values], [v["agreement"] for v in values]
        out["ece_agreement"] = expected_calibration_error(agreement, right, bins)
        out["aurc"] = risk_coverage(agreement, right)[2]
    out.update(abstention_metrics([v["outcome"] for v in values], lam))
    out["response_length"] = mean("greedy_length")
    samples, tokens = sum(v["samples"] for v in values), sum(v["length_sum"] for v in values)
    out["sample_length/mean"] = tokens / samples
    out["sample_length/p90"] = float(np.percentile([x for v in values for x in v["lengths"]], 90))
    out["truncated_share"] = sum(v["truncated"] for v in values) / samples
    out["entropy"] = sum(v["entropy_sum"] for v in values) / max(tokens, 1.0)
    rewarded = [v["restated"] for v in values if v["greedy_correct"]]
    out["gaming_restated_question"] = float(np.mean(rewarded)) if rewarded else 0.0
    out["num_prompts"] = float(len(values))
    return out


def aggregate(records: list[dict], ks: Sequence[int] = (1,), lam: float = 1.0, bins: int = 10) -> dict[str, float]:
    """Every suite metric from per-prompt records (`prompt_record`); formulas in docs/eval.md."""
    if not records:
        raise ValueError("aggregate needs at least one prompt record")
    chosen = ks_for(records, ks)
    return combine([prompt_values(r, chosen) for r in records], lam, bins)


def never_solved(records: list[dict]) -> list[dict]:
    """The prompts where neither the greedy reply nor any sample was correct."""
    return [{k: r[k] for k in ("uid", "question", "gold", "reply")} for r in records
            if not r["greedy_correct"] and not any(r["correct"])]


@contextmanager
def progress_bar(enabled: bool = True):
    """A rich progress bar on stderr (stdout stays for the metrics); one task per phase."""
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled)
    with bar:
        yield bar


def run_suite(engine, tokenizer, rows: list[dict], scorer, cfg: EvalConfig, max_new_tokens: int,
              accuracy_component: str, seed: int = 0, environment: EnvConfig | None = None, lam: float = 1.0,
              detector: dict | None = None, progress: bool = True) -> dict:
    """The suite's JSON document of the evaluator's replies to `rows` (`evaluator.held_out_replies`: the
    training loop's evaluation generates and scores the same replies)."""
    with progress_bar(progress) as bar:
        tasks: dict[str, int] = {}

        def advance(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(f"eval: {phase}", total=total)
            bar.update(tasks[phase], completed=done)

        replies = held_out_replies(engine, tokenizer, rows, scorer, cfg, max_new_tokens, seed, environment,
                                   advance)
    if not replies.rows:
        raise ValueError("no held-out prompts to evaluate (task.num_eval or eval.num_prompts is 0)")
    greedy = replies.greedy
    records = [prompt_record(g, s, accuracy_component, detector)
               for g, s in zip(greedy, replies.sampled or greedy)]
    metrics = aggregate(records, cfg.pass_k, lam)
    scored = {**reward_metrics(greedy), **(episode_metrics(greedy) if replies.episodes else {})}
    metrics.update({k.removeprefix("eval/"): v for k, v in scored.items()})
    settings = {"samples": cfg.samples, "temperature": cfg.temperature, "ks": ks_for(records, cfg.pass_k),
                "max_new_tokens": replies.max_new_tokens, "num_prompts": len(replies.rows), "lam": lam, "seed": seed}
    return {"lmrl_eval": FORMAT, "settings": settings, "metrics": metrics,
            "never_solved": never_solved(records), "prompts": records}


def write_suite(result: dict, path: str | Path) -> Path:
    """Write the suite's JSON (non-finite numbers as null)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(result), indent=1, ensure_ascii=False), encoding="utf-8")
    return path


def eval_target(recipe: str | None, overrides: list[str], model: str | None,
                step: int | None) -> tuple[Config, Path | None]:
    """The config to evaluate and where its JSON goes by default.

    `recipe` may be a run directory: its own config.yaml, with its checkpoint at `step` (default: the
    latest) as the model unless `model` is given. A checkpoint's JSON goes to `RUN/eval/step-N.json`."""
    from lmrl.models.checkpoint_dirs import list_checkpoints
    from lmrl.models.sharded_checkpoint import is_sharded

    run = Path(recipe) if recipe and Path(recipe, "config.yaml").is_file() else None
    if run is None and step is not None:
        raise ConfigError("--step needs a run directory in place of the recipe")
    if run is not None and model is None:
        by_step = {int(p.name.split("-")[1]): p for p in list_checkpoints(run / "checkpoints")}
        if not by_step:
            raise ConfigError(f"{run} has no complete checkpoint to evaluate (or give --model)")
        step = max(by_step) if step is None else step
        if step not in by_step:
            raise ConfigError(f"{run} has no checkpoint at step {step}; it has steps {sorted(by_step)}")
        if is_sharded(by_step[step]):
            raise ConfigError(f"{by_step[step]} holds FSDP shards (trainer.sharding=fsdp): `lmrl export {run} --merge "
                              "DIR` gathers them, then `lmrl eval --model DIR`")
        model = str(by_step[step] / "model")
    cfg = load_config(str(run / "config.yaml") if run else recipe,
                      [*overrides, *([f"model.path={model}"] if model else [])])
    found = re.search(r"^(.*)/checkpoints/step-(\d+)/model/?$", Path(cfg.model.path).as_posix())
    if found and cfg.model.lora is not None:
        raise ConfigError(f"{cfg.model.path} holds LoRA adapters: `lmrl export RUN --merge DIR`, then "
                          f"`lmrl eval --model DIR`")
    return cfg, (Path(found.group(1)) / "eval" / f"step-{int(found.group(2)):06d}.json" if found else None)


def mixture_suite(results: dict[str, dict]) -> dict:
    """One suite document of a task mixture's: each task's under `tasks`, its prompts (tagged with the task) and
    never-solved prompts together, its metrics under `task/<name>/…`, and each metric every task reports over
    all of them (weighted by each task's prompts)."""
    per_task = {name: {**r["metrics"], "num_prompts": float(r["settings"]["num_prompts"])} for name, r in results.items()}
    metrics = across_tasks(per_task, "num_prompts")
    metrics.pop("num_prompts", None)
    for name, r in results.items():
        metrics.update({f"task/{name}/{k}": v for k, v in r["metrics"].items()})
    first = next(iter(results.values()))
    settings = {**first["settings"], "num_prompts": sum(r["settings"]["num_prompts"] for r in results.values())}
    return {"lmrl_eval": FORMAT, "settings": settings, "metrics": metrics,
            "never_solved": [p for r in results.values() for p in r["never_solved"]],
            "prompts": [{**p, "task": name} for name, r in results.items() for p in r["prompts"]],
            "tasks": {name: {"settings": r["settings"], "metrics": r["metrics"]} for name, r in results.items()}}


def run_eval(cfg: Config, probe: str | None = None) -> dict:
    """Load `cfg`'s model and held-out prompts and run the suite (and the reward-seeking probe, if given)."""
    from lmrl.envs.pieces import build_pieces
    from lmrl.rewards import RewardScorer
    from lmrl.validation import check_names

    check_names(cfg)
    pieces = build_pieces(cfg)
    model, tokenizer = pieces.model, pieces.tokenizer
    params = abstention_params(cfg)
    tasks = [(e.name, e.cfg, e.eval_rows) for e in pieces.mixture if e.eval_rows] or [(None, cfg, pieces.eval_rows)]
    results = {name: run_suite(pieces.engine, tokenizer, rows, RewardScorer(own.reward), cfg.eval,
                               cfg.rollout.max_new_tokens, own.reward.accuracy_component, seed=cfg.trainer.seed,
                               environment=own.env, lam=float(params.get("lam", 1.0)),
                               detector={k: v for k, v in params.items() if k in DETECTOR_KEYS},
                               progress=cfg.run.progress)
               for name, own, rows in tasks}
    result = results[None] if None in results else mixture_suite(results)
    result["model"] = str(cfg.model.path)
    if probe:
        from lmrl.eval.reward_seeking import load_probe, measure

        with progress_bar(cfg.run.progress) as bar:
            result["reward_seeking"] = measure(model, tokenizer, load_probe(probe), cfg, bar)
        result["reward_seeking"]["probe"] = str(probe)
        result["metrics"].update(result["reward_seeking"]["metrics"])
    return result
