"""Reward shaping applied to sequence rewards before advantages (e.g. DAPO's overlong penalty)."""
from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment: min(-(L - (L_max - B)) / B * factor, 0)."""
    expected = max_len - buffer
    return torch.clamp(-(lengths.float() - expected) / buffer * factor, max=0.0)
