"""The error lmrl raises for a bad configuration, apart from `lmrl.config` so that the modules it uses can raise it."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, reported before any model loads."""
