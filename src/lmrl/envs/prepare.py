"""The task's rows ready for a run: loaded, encoded with the chat template, with their prompt variants."""
from __future__ import annotations

from lmrl.config import Config
from lmrl.envs.single_turn import add_prompt_variants, encode_rows
from lmrl.envs.tasks import TaskData, TaskError, load_task
from lmrl.errors import ConfigError


def prepare_data(cfg: Config, tokenizer, task: TaskData | None = None) -> tuple[list[dict], list[dict], dict[str, float]]:
    """Training rows, held-out rows and notes for the run's metrics (both counts, prompts dropped for length).

    `task`: rows already loaded (by default `load_task(cfg.task)`). Fails before any model loads when no
    training prompt fits `task.max_prompt_tokens`, a `task.prompt_variants` prompt does not, or fewer
    training rows are left than one step rolls out (`rollout.prompts_per_step`)."""
    task = task or load_task(cfg.task)
    train, held, notes = encode_task(cfg, tokenizer, task)
    check_rows_for_a_step(cfg, len(train), task, dropped=len(task.train) - len(train))
    return train, held, notes


def encode_task(cfg: Config, tokenizer, task: TaskData) -> tuple[list[dict], list[dict], dict[str, float]]:
    """`prepare_data` without the step-size check (the dry run encodes only the first rows)."""
    train, dropped_train = encode_rows(tokenizer, task.train, cfg.task.system_prompt, cfg.task.max_prompt_tokens)
    held, dropped_eval = encode_rows(tokenizer, task.eval, cfg.task.system_prompt, cfg.task.max_prompt_tokens)
    if not train:
        raise TaskError(f"every training prompt is longer than task.max_prompt_tokens={cfg.task.max_prompt_tokens}")
    if cfg.task.prompt_variants:
        train = add_prompt_variants(tokenizer, train, cfg.task.prompt_variants, cfg.task.system_prompt)
        longest = max(len(v["prompt_ids"]) for r in train for v in r["variants"])
        if longest > cfg.task.max_prompt_tokens:
            raise TaskError(f"a task.prompt_variants prompt is {longest} tokens, over task.max_prompt_tokens="
                            f"{cfg.task.max_prompt_tokens}; shorten the instruction or raise the limit")
    return train, held, {"data/dropped_long_prompts": float(dropped_train + dropped_eval),
                         "data/train_rows": float(len(train)), "data/eval_rows": float(len(held))}


def check_rows_for_a_step(cfg: Config, n_train: int, task: TaskData, dropped: int = 0) -> None:
    """A step rolls out `rollout.prompts_per_step` prompts: fewer training rows would put the same prompt in one
    step's batch several times, so that is refused."""
    need = cfg.rollout.prompts_per_step
    if n_train >= need:
        return
    lost = f" (after dropping prompts over task.max_prompt_tokens: {dropped})" if dropped else ""
    raise ConfigError(f"task {cfg.task.name}: {n_train} training rows{lost}, fewer than one step rolls out "
                      f"(rollout.prompts_per_step={need}); the split was {task.summary()}. Lower "
                      "rollout.prompts_per_step, hold out fewer rows (task.num_eval) or give the held-out rows "
                      "their own file (task.params.eval_dataset)")
