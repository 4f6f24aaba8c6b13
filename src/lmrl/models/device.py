"""`trainer.device`: where the policy, reference, value head and optimiser state live.

"auto" is the first CUDA device when one is available, else the CPU. Asking for CUDA where there
is none (or for a CUDA index past the last device) fails here, before any weights load, naming
what was asked and what the machine has.
"""
from __future__ import annotations

import torch

from lmrl.config import ConfigError


def resolve_device(setting: str = "auto") -> torch.device:
    """The torch device for `setting`: auto | cpu | cuda | cuda:N."""
    if setting == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(setting)
    except RuntimeError:
        raise ConfigError(f"trainer.device={setting!r}: expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"trainer.device={setting!r}: expected auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        why = f"torch {torch.__version__} is a CPU build" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(f"trainer.device={setting!r} but CUDA is not available ({why}); "
                          "use trainer.device=cpu (or auto)")
    count = torch.cuda.device_count()
    index = 0 if device.index is None else device.index
    if index >= count:
        raise ConfigError(f"trainer.device={setting!r} but this machine has {count} CUDA device(s), "
                          f"cuda:0..cuda:{count - 1}")
    return torch.device("cuda", index)
