"""The errors lmrl reports as one message instead of a traceback, apart from `lmrl.config` so that the modules
it uses can raise them."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, reported before any model loads."""


class RewardErrorRate(RuntimeError):
    """A training step whose share of samples with reward errors is above `reward.max_error_rate`: a broken
    reward, which would otherwise train on what is left of the batch."""
