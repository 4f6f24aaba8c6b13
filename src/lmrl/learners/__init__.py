"""Learners: the policy (and reference) wrappers, micro-batching, optimiser and checkpoint state."""
from lmrl.learners.checkpoint import load_checkpoint, save_checkpoint
from lmrl.learners.packing import fill_budget
from lmrl.learners.policy import Learner

__all__ = ["Learner", "load_checkpoint", "save_checkpoint", "fill_budget"]
