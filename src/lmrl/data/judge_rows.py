"""Task rows that train a judge by RL (docs/stages/judges.md): written before the judge's stage by
`python -m lmrl.task_files judge_rows` and `rubric_rows`, read by the `jsonl` task.

GRRM judge rows (`grrm_rows_from_rollouts`, `grrm_rows_from_pairs`): `question` is GRRM's own judge
prompt (`lmrl.rewards.judges.grrm_prompt`, the one `judge_grrm` sends) over a group of candidates in a
seeded shuffled order (position bias cancels over the rows), `reference_scores` the candidates' scores
on 0–`max_score`, read by the `grrm_rm` reward and never shown in the prompt; `answer` is their score
line. From a run's recorded rollouts (`RUN/rollouts.jsonl`, one record per group) a candidate's
reference is its recorded reward mapped linearly from [`reward_low`, `reward_high`] onto 0–`max_score`
and rounded; from a preference dataset the chosen reply scores `chosen_score`, the rejected one
`rejected_score`.

EVOLM rubric rows (`rubric_rows`): temporal contrast, one row per prompt both files recorded: `question`
asks for a rubric (`judge_self_rubric`'s rubric prompt), `chosen` is y⁺, a recorded reply of the newest
step of the current file, `rejected` is y⁻, one of the oldest step of the earlier file (the same file
twice: its first step against its last), read by the `evolm_generator` reward.

GenAC critic rows (`critic_rows_from_rollouts`, confidence low): one row per recorded group, in the order of
the steps; `question` is the critic prompt (`lmrl.rewards.genac.critic_prompt`) over the prompt and the K
rollouts of that prompt's previous recorded group with their outcomes, `success_rate` this group's share of
replies the accuracy component scored correct (>= 1), read by the `genac_critic` reward, never shown. The task
`critic_rows` builds them when a run starts, from the `rollouts.jsonl` that is its `task.dataset` (in a
pipeline, `{from: <actor stage>, file: rollouts.jsonl}`), so a critic stage can follow an actor stage.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Any

from lmrl.data.sft import implicit_prompt, is_chat
from lmrl.config import TaskConfig
from lmrl.envs.tasks import TASKS, TaskData, TaskError, read_jsonl, split_rows
from lmrl.recipe_files import shipped_or_local
from lmrl.rewards.genac import critic_prompt
from lmrl.rewards.judges import LETTERS, MAKE_RUBRIC, grrm_prompt


def _text(value: Any, role: str | None = None) -> str:
    """A string as it is; a list of messages as its last message of `role` (any role: the last one)."""
    if isinstance(value, str):
        return value
    if is_chat(value):
        chosen = [m.get("content") or "" for m in value if role is None or m.get("role") == role]
        return chosen[-1] if chosen else ""
    raise TaskError(f"expected text or a list of {{role, content}} messages, got {type(value).__name__}")


def _prompt_of(record: dict, where: str) -> str:
    if "messages" in record and is_chat(record["messages"]):
        return _text(record["messages"], "user")
    if isinstance(record.get("question"), str):
        return record["question"]
    raise TaskError(f"{where}: no prompt text ('question' or 'messages')")


def score_line(scores: dict[str, float]) -> str:
    return ", ".join(f"{k}: {v:g}" for k, v in sorted(scores.items()))


def grrm_row(prompt: str, scored: list[tuple[str, float]], rng: random.Random, max_score: int,
             **fields: Any) -> dict:
    """One judge row over `scored` (candidate text, reference score), presented in a shuffled order."""
    shown = list(scored)
    rng.shuffle(shown)
    ref = {LETTERS[i]: score for i, (_, score) in enumerate(shown)}
    return {"question": grrm_prompt(prompt, [t for t, _ in shown], max_score), "answer": score_line(ref),
            "reference_scores": ref, "prompt": prompt, "candidates": [t for t, _ in shown], **fields}


def _row_rng(seed: int, key: str) -> random.Random:
    return random.Random(f"{seed}/{key}")


def grrm_rows_from_rollouts(records: list[dict], seed: int = 0, max_candidates: int = 4, max_score: int = 10,
                            reward_low: float = 0.0, reward_high: float = 1.0) -> tuple[list[dict], Counter]:
    """One judge row per recorded group with at least two distinct non-empty replies (at most `max_candidates`,
    a seeded choice); the reasons other groups were skipped."""
    if not 2 <= max_candidates <= len(LETTERS) or reward_high <= reward_low:
        raise ValueError(f"max_candidates must be in 2..{len(LETTERS)} and reward_high > reward_low "
                         f"(got {max_candidates}, [{reward_low}, {reward_high}])")
    rows, skipped = [], Counter()
    for i, record in enumerate(records):
        where = f"record {i}"
        if not isinstance(record, dict) or not isinstance(record.get("rollouts"), list):
            raise TaskError(f"{where} has no 'rollouts' list (a run's rollouts.jsonl, written with "
                            "run.save_rollouts=true)")
        rewards: dict[str, list[float]] = {}
        for r in record["rollouts"]:
            if r.get("text", "").strip() and r.get("reward") is not None:
                rewards.setdefault(r["text"], []).append(float(r["reward"]))
        if len(rewards) < 2:
            skipped["fewer than 2 distinct replies"] += 1
            continue
        rng = _row_rng(seed, str(record.get("uid", i)))
        texts = rng.sample(sorted(rewards), min(max_candidates, len(rewards)))
        scored = []
        for text in texts:
            reward = sum(rewards[text]) / len(rewards[text])
            if not reward_low <= reward <= reward_high:
                raise TaskError(f"{where}: a recorded reward {reward:g} is outside [{reward_low:g}, {reward_high:g}], "
                                "the range mapped onto the judge's scores; set --reward-range LOW HIGH")
            scored.append((text, round(max_score * (reward - reward_low) / (reward_high - reward_low))))
        rows.append(grrm_row(_prompt_of(record, where), scored, rng, max_score, uid=f"judge-{record.get('uid', i)}"))
    return rows, skipped


def grrm_rows_from_pairs(records: list[dict], seed: int = 0, chosen_score: int = 7, rejected_score: int = 3,
                         max_score: int = 10) -> list[dict]:
    """One judge row per preference pair (`prompt`/`chosen`/`rejected`, or a shared prompt implicit in both)."""
    if not 0 <= rejected_score < chosen_score <= max_score:
        raise ValueError(f"need 0 <= rejected_score < chosen_score <= max_score (got {rejected_score}, "
                         f"{chosen_score}, {max_score})")
    rows = []
    for i, record in enumerate(records):
        where = f"record {i}"
        if not isinstance(record, dict) or "chosen" not in record or "rejected" not in record:
            raise TaskError(f"{where}: a preference pair needs 'chosen' and 'rejected' (and 'prompt')")
        if "prompt" in record:
            prompt, chosen, rejected = record["prompt"], record["chosen"], record["rejected"]
        else:
            prompt, chosen, rejected = implicit_prompt(record["chosen"], record["rejected"], where)
        prompt_text = _text(prompt, "user" if is_chat(prompt) else None)
        chosen, rejected = _text(chosen, "assistant" if is_chat(chosen) else None), _text(
            rejected, "assistant" if is_chat(rejected) else None)
        if chosen == rejected or not chosen.strip() or not rejected.strip():
            raise TaskError(f"{where}: chosen and rejected must be two different non-empty replies")
        rows.append(grrm_row(prompt_text, [(chosen, chosen_score), (rejected, rejected_score)],
                             _row_rng(seed, str(i)), max_score, uid=f"judge-pair-{i}"))
    return rows


def _by_prompt(records: list[dict], newest: bool) -> dict[str, tuple[int, list[str]]]:
    """Each prompt's non-empty replies of its newest (or oldest) recorded step."""
    out: dict[str, tuple[int, list[str]]] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("rollouts"), list):
            raise TaskError(f"record {i} has no 'rollouts' list (a run's rollouts.jsonl)")
        prompt, step = _prompt_of(record, f"record {i}"), int(record.get("step", 0))
        texts = [r["text"] for r in record["rollouts"] if r.get("text", "").strip()]
        held = out.get(prompt)
        if not texts:
            continue
        if held is None or (step > held[0] if newest else step < held[0]):
            out[prompt] = (step, texts)
        elif held[0] == step:
            held[1].extend(texts)
    return out


def rubric_rows(current: list[dict], earlier: list[dict], seed: int = 0, one_run: bool = False,
                template: str = MAKE_RUBRIC) -> tuple[list[dict], Counter]:
    """One rubric-writing row per prompt in both files: y⁺ from `current`'s newest step, y⁻ from `earlier`'s
    oldest (seeded choices among that step's replies); prompts with no contrast are skipped and counted.
    `one_run`: both are one run's records, so a prompt recorded at a single step has no contrast."""
    newer, older = _by_prompt(current, newest=True), _by_prompt(earlier, newest=False)
    rows, skipped = [], Counter()
    for prompt in sorted(newer):
        if prompt not in older:
            skipped["not in the earlier rollouts"] += 1
            continue
        (new_step, new_texts), (old_step, old_texts) = newer[prompt], older[prompt]
        if one_run and new_step <= old_step:
            skipped["recorded at one step only"] += 1
            continue
        rng = _row_rng(seed, prompt)
        chosen, rejected = rng.choice(new_texts), rng.choice(old_texts)
        if chosen == rejected:
            skipped["identical replies"] += 1
            continue
        rows.append({"question": template.format(prompt=prompt), "answer": "", "prompt": prompt, "chosen": chosen,
                     "rejected": rejected, "chosen_step": new_step, "rejected_step": old_step,
                     "uid": f"rubric-{len(rows)}"})
    return rows, skipped


def critic_rows_from_rollouts(records: list[dict], accuracy: str = "answer", k: int = 4,
                              max_chars: int = 400) -> tuple[list[dict], Counter]:
    """GenAC critic rows from a run's `rollouts.jsonl` records; the reasons groups were skipped (no rollout the
    accuracy component scored)."""
    if k < 0:
        raise ValueError(f"k must be >= 0 (got {k})")
    rows, skipped, previous = [], Counter(), {}
    ordered = sorted(enumerate(records), key=lambda item: (item[1].get("step", 0) if isinstance(item[1], dict)
                                                           else 0, item[0]))
    for i, record in ordered:
        where = f"record {i}"
        if not isinstance(record, dict) or not isinstance(record.get("rollouts"), list):
            raise TaskError(f"{where} has no 'rollouts' list (a run's rollouts.jsonl, written with "
                            "run.save_rollouts=true)")
        graded = [(r.get("text", ""), r["rewards"][accuracy] >= 1.0) for r in record["rollouts"]
                  if accuracy in (r.get("rewards") or {})]
        if not graded:
            skipped[f"no rollout scored by {accuracy!r}"] += 1
            continue
        problem = _prompt_of(record, where)
        recent = previous.get(problem, [])[-k:] if k else []
        rows.append({"uid": f"critic-{record.get('uid', i)}", "question": critic_prompt(problem, "", recent, max_chars),
                     "answer": "", "success_rate": sum(ok for _, ok in graded) / len(graded)})
        previous[problem] = graded
    return rows, skipped


@TASKS.register("critic_rows", "GenAC critic prompts built from a run's recorded rollouts (task.dataset: its "
                "rollouts.jsonl), each with the actor group's success rate (the genac_critic reward)", splits_rows=True)
def critic_rows_task(cfg: TaskConfig) -> TaskData:
    """`critic_rows_from_rollouts` over `task.dataset`; `task.params`: `accuracy` (answer), `k` (4), `max_chars`
    (400). The held-out rows are split off as the jsonl task's are."""
    knobs = {"accuracy": "answer", "k": 4, "max_chars": 400, **cfg.params}
    unknown = sorted(set(knobs) - {"accuracy", "k", "max_chars"})
    if unknown:
        raise TaskError(f"task critic_rows: unknown task.params {unknown}; it takes accuracy, k and max_chars")
    path = shipped_or_local(cfg.dataset)
    records, _ = read_jsonl(path, "task.dataset")
    rows, _ = critic_rows_from_rollouts(records, knobs["accuracy"], int(knobs["k"]), int(knobs["max_chars"]))
    if not rows:
        raise TaskError(f"{path}: no recorded group has a rollout scored by {knobs['accuracy']!r}, so no critic rows")
    return split_rows(rows, cfg, str(path))
