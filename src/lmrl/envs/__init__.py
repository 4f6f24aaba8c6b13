"""Tasks and environments: single-turn datasets (reasoning-gym, JSONL, HF datasets) and multi-turn
environments (tool use, games; `ENVIRONMENTS`, docs/environments.md)."""
from lmrl.envs.single_turn import (encode_prompt, encode_rows, expand_prompts, pooled, prompt_families,
                                   prompt_messages, rollout)
from lmrl.envs.tasks import TASKS, TaskData, TaskError, load_task
from lmrl.envs.prepare import prepare_data
from lmrl.envs.environment import ENVIRONMENTS, Environment, Step, build_env
from lmrl.envs.attribution import delayed_attribution
import lmrl.envs.humaneval  # noqa: F401,E402  (registers the humaneval task)
import lmrl.envs.tools, lmrl.envs.bandit, lmrl.envs.guessing, lmrl.envs.revise  # noqa: F401,E401,E402  (registers the environments)
import lmrl.envs.search, lmrl.envs.negotiation, lmrl.envs.textarena_adapter, lmrl.envs.code_interpreter, lmrl.envs.gaming_probe  # noqa: F401,E401,E402
import lmrl.envs.sales, lmrl.envs.doctor, lmrl.envs.self_emo, lmrl.envs.seif  # noqa: F401,E401,E402
import lmrl.envs.writing_tasks  # noqa: F401,E402  (registers the stay_in_language and staged_abstracts tasks)
import lmrl.envs.fact_tasks  # noqa: F401,E402  (registers the closed_book task)
from lmrl.envs.controllers import ROLLOUT_CONTROLLERS  # noqa: E402
import lmrl.envs.dual_track  # noqa: F401,E402  (registers the dual-track controller)
import lmrl.envs.rail_rollout  # noqa: F401,E402  (registers the RAIL controller)
import lmrl.envs.tree_rollout  # noqa: F401,E402  (registers the tree controller)
import lmrl.envs.mc_steps  # noqa: F401,E402  (registers the mc_steps controller)

__all__ = ["ENVIRONMENTS", "ROLLOUT_CONTROLLERS", "Environment", "Step", "TASKS", "TaskData", "TaskError", "build_env", "delayed_attribution", "encode_prompt",
           "encode_rows", "expand_prompts", "load_task", "pooled", "prepare_data", "prompt_families", "prompt_messages",
           "rollout"]
