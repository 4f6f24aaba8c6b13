"""The readable top-level training loop: one step loop over a batch source (`loops.loop`)."""
from lmrl.loops.dispatch import train
from lmrl.loops.loop import RunResult
from lmrl.loops.setup import Stages, build_stages

__all__ = ["RunResult", "Stages", "build_stages", "train"]
