"""The readable top-level training loops (synchronous today)."""
from lmrl.loops.setup import Stages, build_stages
from lmrl.loops.sync import RunResult, train

__all__ = ["RunResult", "Stages", "build_stages", "train"]
