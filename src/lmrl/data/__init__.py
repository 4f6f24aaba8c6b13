"""Prompt sources and samplers, and group filters applied after scoring."""
from lmrl.data.samplers import GROUP_FILTERS, SAMPLERS, UniformSampler

__all__ = ["GROUP_FILTERS", "SAMPLERS", "UniformSampler"]
