"""Precision choice: bf16 autocast only where the hardware runs it fast.

On CPUs without AMX or AVX512-BF16, bf16 matmuls are emulated and much slower than fp32
(measured on a 2-core AVX2 EPYC: forward 3.7x, backward 30x slower), so "auto" picks fp32 there.
"""
from __future__ import annotations

import torch


def fast_bf16(device: torch.device | str) -> bool:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    return False


def resolve_bf16(setting: bool | str, device: torch.device | str) -> bool:
    """`trainer.bf16`: True, False, or "auto" (on when the device has fast bf16)."""
    return fast_bf16(device) if setting == "auto" else bool(setting)
