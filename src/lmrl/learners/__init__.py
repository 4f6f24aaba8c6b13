"""Learners: the policy (and reference) wrappers, micro-batching, optimiser and checkpoint state."""
from lmrl.learners.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from lmrl.learners.policy import Learner, token_budget_micro_batches

__all__ = ["Learner", "latest_checkpoint", "load_checkpoint", "save_checkpoint", "token_budget_micro_batches"]
