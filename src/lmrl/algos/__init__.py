"""Algorithms as pure tensor functions in registries: advantages, losses, aggregation, KL, shaping."""
from lmrl.algos.advantages import ADVANTAGES
from lmrl.algos.aggregation import AGGREGATIONS, AggScale
from lmrl.algos.algorithm import Algorithm
from lmrl.algos.kl import KL_ESTIMATORS
from lmrl.algos.losses import LOSSES, LossInputs

__all__ = ["ADVANTAGES", "AGGREGATIONS", "AggScale", "Algorithm", "KL_ESTIMATORS", "LOSSES", "LossInputs"]
