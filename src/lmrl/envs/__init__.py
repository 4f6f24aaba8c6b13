"""Tasks and environments: single-turn datasets (reasoning-gym, JSONL, HF datasets)."""
from lmrl.envs.single_turn import encode_prompt, encode_rows, prompt_messages, rollout
from lmrl.envs.tasks import TASKS, TaskData, TaskError, load_task
import lmrl.envs.humaneval  # noqa: F401,E402  (registers the humaneval task)

__all__ = ["TASKS", "TaskData", "TaskError", "encode_prompt", "encode_rows", "load_task", "prompt_messages", "rollout"]
