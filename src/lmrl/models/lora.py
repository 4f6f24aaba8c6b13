"""LoRA through peft: wrap a model with adapters, load saved adapters back, export a merged model.

Only the adapters train; the base weights stay frozen and bit-exact, so the base itself (the
adapters disabled) is the reference policy, with no second copy of the model. A checkpoint of a
LoRA run holds the adapters (peft's `adapter_model.safetensors` and `adapter_config.json`); the
export folds them into the base weights (`weights.inference_weights`) and writes a plain
transformers directory: a causal LM, or for a reward model (a run with a score head) a
sequence-classification model, for a process reward model a token-classification one (`sequence_classifier.py`).
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from lmrl.config import ConfigError, LoraConfig
from lmrl.models.loading import load_model, resolve_model_path
from lmrl.models.sequence_classifier import as_classifier, pad_token_id_of
from lmrl.models.sharded_checkpoint import gather_weights, is_sharded
from lmrl.models.weights import inference_weights, is_peft

ADAPTER_FILE = "adapter_model.safetensors"


def apply_lora(model, cfg: LoraConfig):
    """`model` wrapped with trainable LoRA adapters (peft), its own weights frozen."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    if is_peft(model):
        raise ValueError("the model already carries peft adapters; pass the base model with model.lora set")
    peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                              target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, peft_cfg)
    except ValueError as err:
        raise ConfigError(f"model.lora.target_modules={cfg.target_modules!r}: {err}") from None


def frozen_base_in_bf16(model) -> None:
    """Store the frozen weights of the adapted linear layers in bf16, for a model run under bf16 autocast.

    Autocast computes linear layers in bf16 and casts fp32 weights on every call; it caches the casts
    only of weights that require gradients, so a frozen fp32 base would be cast again in every forward
    pass, each decoding step of a rollout included. Stored in bf16, the same values are used without
    the casts (every autocast pass gives the same numbers) and the base takes half the memory. Only
    the base layers of adapted linear layers change: embeddings, norms and the LM head stay fp32.
    """
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer) and isinstance(module.base_layer, torch.nn.Linear):
            module.base_layer.to(torch.bfloat16)


def load_adapter(model, directory: Path) -> None:
    """Copy the adapters saved in `directory` into the wrapped `model`'s (on-device) adapter weights."""
    from peft import set_peft_model_state_dict

    file = Path(directory) / ADAPTER_FILE
    if not file.exists():
        raise RuntimeError(f"{directory} has no {ADAPTER_FILE}: it was saved by a full fine-tuning run, "
                           "not a LoRA one (model.lora)")
    result = set_peft_model_state_dict(model, load_file(str(file)))
    missing = [k for k in result.missing_keys if ".lora_" in k and ".default." in k]  # (not a role's adapter)
    if missing or result.unexpected_keys:
        raise RuntimeError(f"the adapters in {directory} do not match model.lora "
                           f"(missing {missing[:3]}, unexpected {list(result.unexpected_keys)[:3]})")


def export_merged(checkpoint_model: Path, base_path: str, lora: LoraConfig | None, out: Path,
                  score_weight: torch.Tensor | None = None) -> Path:
    """Write a transformers directory (weights, config, tokenizer) for a checkpoint's `model/` folder.

    A full fine-tuning checkpoint already is one and is copied; a sharded learner's has its shards
    gathered (`sharded_checkpoint.gather_weights`). A LoRA checkpoint's adapters (a sharded learner's
    too: it writes them whole, as peft's files) are loaded onto the base model (`base_path`, the run's
    `model.path`) and folded into its weights.
    With `score_weight` (a reward model's score head, [1, H]) the directory is a sequence-classification
    model instead (a process reward model's [2, H]: a token-classification model), its config's `pad_token_id` the token `pad_token_id_of` picks (never the one that ends
    the rows it scores), which the saved tokenizer then also pads with, so any caller's padding pools right.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose a new directory for the export")
    checkpoint_model = Path(checkpoint_model)
    if is_sharded(checkpoint_model.parent) and not (checkpoint_model / ADAPTER_FILE).exists():
        # a sharded learner's whole model: its shards gathered into whole weights first
        with tempfile.TemporaryDirectory() as scratch:
            whole = gather_weights(checkpoint_model.parent, Path(scratch) / "model")
            return export_merged(whole, base_path, lora, out, score_weight)
    if lora is None and (checkpoint_model / ADAPTER_FILE).exists():
        raise RuntimeError(f"{checkpoint_model} holds LoRA adapters but the run's config has no model.lora")
    if lora is None and score_weight is None:
        shutil.copytree(checkpoint_model, out, dirs_exist_ok=True)
        return out
    model = load_model(checkpoint_model) if lora is None else _merged_lora(checkpoint_model, base_path, lora)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_model)
    if score_weight is not None:
        pad = pad_token_id_of(tokenizer)
        if pad is not None:
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
        model = as_classifier(model, score_weight, pad)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _merged_lora(checkpoint_model: Path, base_path: str, lora: LoraConfig):
    """The base model (`base_path`) with a checkpoint's adapters folded into its weights, peft removed."""
    model = apply_lora(load_model(resolve_model_path(base_path)), lora)
    load_adapter(model, checkpoint_model)
    merged = dict(inference_weights(model))
    base = model.unload()
    base.load_state_dict(merged)
    return base


class AdapterSwitch:
    """The adapters of one peft model taking turns (several roles on one base, docs/roles.md): `use(name)` makes
    adapter `name` the active and trainable one for a block, under one lock, and puts the policy's ("default")
    back after it, so the policy's generation and updates always find their own adapter in place."""

    def __init__(self, model):
        import threading

        self.model, self.lock = model, threading.RLock()

    def add(self, name: str, cfg: LoraConfig) -> None:
        """A new adapter `name` (zero-initialised B: it starts as the base), inactive."""
        from peft import LoraConfig as PeftLoraConfig

        with self.lock:
            self.model.add_adapter(name, PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                                        target_modules=cfg.target_modules, task_type="CAUSAL_LM"))
            self.model.set_adapter("default")

    @contextlib.contextmanager
    def use(self, name: str):
        with self.lock:
            self.model.set_adapter(name)
            try:
                yield
            finally:
                self.model.set_adapter("default")
