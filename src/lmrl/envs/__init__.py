"""Tasks and environments: single-turn datasets (reasoning-gym, JSONL, HF datasets)."""
from lmrl.envs.single_turn import (encode_prompt, encode_rows, expand_prompts, pooled, prompt_families,
                                   prompt_messages, rollout)
from lmrl.envs.tasks import TASKS, TaskData, TaskError, load_task
from lmrl.envs.prepare import prepare_data
import lmrl.envs.humaneval  # noqa: F401,E402  (registers the humaneval task)

__all__ = ["TASKS", "TaskData", "TaskError", "encode_prompt", "encode_rows", "expand_prompts", "load_task", "pooled",
           "prepare_data", "prompt_families", "prompt_messages", "rollout"]
