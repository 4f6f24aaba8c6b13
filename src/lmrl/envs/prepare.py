"""The task's rows ready for a run: loaded, encoded with the chat template, with their prompt variants."""
from __future__ import annotations

from lmrl.config import Config
from lmrl.envs.single_turn import add_prompt_variants, encode_rows
from lmrl.envs.tasks import TaskError, load_task


def prepare_data(cfg: Config, tokenizer) -> tuple[list[dict], list[dict], dict[str, float]]:
    """Training rows, held-out rows and notes for the run's metrics (prompts dropped for length).

    Fails before any model loads when no training prompt fits `task.max_prompt_tokens`, or a
    `task.prompt_variants` prompt does not."""
    task = load_task(cfg.task)
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
    return train, held, {"data/dropped_long_prompts": float(dropped_train + dropped_eval)}
