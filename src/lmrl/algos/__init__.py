"""Algorithms as pure tensor functions in registries: advantages, losses, aggregation, KL, shaping."""
from lmrl.algos import advantages_extra, losses_trust  # noqa: F401  (registration)
from lmrl.algos import methods_control  # noqa: F401  (registration)
from lmrl.algos import methods_group  # noqa: F401  (registration)
from lmrl.algos.advantages import ADVANTAGES
from lmrl.algos.aggregation import AGGREGATIONS, AggScale
from lmrl.algos.algorithm import Algorithm
from lmrl.algos.divergences import DIVERGENCES
from lmrl.algos.kl import KL_ESTIMATORS
from lmrl.algos.losses import LOSSES, LossInputs

__all__ = ["ADVANTAGES", "AGGREGATIONS", "DIVERGENCES", "AggScale", "Algorithm", "KL_ESTIMATORS", "LOSSES", "LossInputs"]
