"""lmrl: reinforcement-learning post-training of language models, from a laptop CPU to a cluster.

The Python API (docs/python_api.md): `lmrl.recipe` builds a config, `lmrl.train` trains it on your
own data, reward functions and environments, `lmrl.evaluate` runs the evaluation suite. They load on
first use, so that `import lmrl` and `lmrl --help` do not wait for torch.
"""
__version__ = "0.1.0"

_LAZY = {"recipe": "lmrl.api", "train": "lmrl.api", "evaluate": "lmrl.api", "TrainResult": "lmrl.api",
         "Sample": "lmrl.types", "Step": "lmrl.envs.environment"}

__all__ = ["Sample", "Step", "TrainResult", "__version__", "evaluate", "recipe", "train"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'lmrl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
