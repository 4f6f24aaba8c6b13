"""Data-parallel training over torch.distributed: the learner's hooks and process-group set-up (docs/scaling.md)."""
from lmrl.dist.data_parallel import DataParallel, Parallel, assign_groups
from lmrl.dist.sharded import Sharded
from lmrl.dist.process_group import default_backend, init_explicit, init_from_env, spawn_local, teardown

__all__ = ["DataParallel", "Parallel", "Sharded", "assign_groups", "default_backend", "init_explicit", "init_from_env",
           "spawn_local", "teardown"]
