"""Algorithms as pure tensor functions in registries: advantages, losses, aggregation, KL.

Importing the package registers every method: each module below adds its estimators or losses,
with their declarations, to `ADVANTAGES` / `LOSSES` (docs/methods/README.md lists them).
"""
from lmrl.algos import controllers, credit_assignment, critic, entropy_control  # noqa: F401  (registration)
from lmrl.algos import multi_reward, rollout_correction, soft_clipping  # noqa: F401  (registration)
from lmrl.algos import mc_step, preference, process_reward, regen, tree_credit  # noqa: F401  (registration)
from lmrl.algos import structured_credit, token_level  # noqa: F401  (registration)
from lmrl.algos import generative_critic  # noqa: F401  (registration)
from lmrl.algos.advantages import ADVANTAGES
from lmrl.algos.aggregation import AGGREGATIONS, AggScale
from lmrl.algos.algorithm import Algorithm
from lmrl.algos.divergences import DIVERGENCES
from lmrl.algos.kl import KL_ESTIMATORS
from lmrl.algos.losses import LOSSES, LossInputs

__all__ = ["ADVANTAGES", "AGGREGATIONS", "DIVERGENCES", "AggScale", "Algorithm", "KL_ESTIMATORS", "LOSSES", "LossInputs"]
