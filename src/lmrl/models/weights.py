"""The policy's weights as an inference engine loads them: transformers names, adapters folded in.

A rollout engine that keeps its own copy of the weights (vLLM) is sent these after every update. For
a plain model they are its parameters and persistent buffers; for a peft LoRA model each adapted
layer's weight is sent as W + ΔW (ΔW = scale·B·A of the active adapters), computed on the fly: the
trained model is never merged in place, so its base weights stay bit-exact over any number of syncs.
"""
from __future__ import annotations

import copy
from typing import Iterator

import torch


def is_peft(model) -> bool:
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def inference_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs under the base model's transformers names; LoRA deltas folded into their layers."""
    if not is_peft(model):
        yield from _detached(model.state_dict())
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".")
        if owner.endswith(".base_layer") and owner[: -len(".base_layer")] in adapted:
            layer_name = owner[: -len(".base_layer")]
            if leaf == "weight":
                tensor = _merged_weight(adapted[layer_name], tensor)
            name = f"{layer_name}.{leaf}"
        yield name, tensor.detach()


def detached_copy(model):
    """A plain copy of the policy with its own weights (a LoRA model's adapters merged into the copy),
    whose parameter names are those `inference_weights` yields: a rollout engine that loads versions."""
    clone = copy.deepcopy(model)
    if is_peft(clone):
        clone = clone.merge_and_unload()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone.eval()


def _merged_weight(layer, weight: torch.Tensor) -> torch.Tensor:
    if layer.merged or layer.disable_adapters:
        return weight
    with torch.no_grad():
        merged = weight.clone()
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                merged += layer.get_delta_weight(adapter).to(merged.dtype)
    return merged


def _detached(state: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in state.items():
        yield name, tensor.detach()
