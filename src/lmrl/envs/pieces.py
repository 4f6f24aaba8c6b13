"""What every entry point that runs a config's model on its task builds first: tokenizer → data → model
on `trainer.device` → engine.

Training (`loops.setup.build_stages`), `lmrl eval` and `lmrl.evaluate` (`eval.suite.run_eval`), the
abstention evaluation and the data scripts (`data.peers`, `data.hints`) build these here, each only as
far as it needs; the training parts (learner, optimiser, reference) are built on top by the loop's setup,
so an evaluation never pays for them. It sits with the run's data (`prepare_data`), below all its callers.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lmrl.config import Config
from lmrl.engines import build_engine
from lmrl.envs.mixture import load_mixture
from lmrl.envs.prepare import prepare_data
from lmrl.envs.tasks import TaskData, load_task
from lmrl.models import load_model, load_tokenizer, resolve_model_path
from lmrl.models.device import resolve_device
from lmrl.models.lora import apply_lora, frozen_base_in_bf16
from lmrl.models.precision import resolve_bf16
from lmrl.models.weights import is_peft


@dataclass
class Pieces:
    """What `build_pieces` built: the device and data always, the model and engine when asked for."""

    device: torch.device  # trainer.device, resolved: where the model is
    tokenizer: Any
    task: TaskData  # the task's rows as loaded (its split, for the summary)
    train_rows: list[dict]  # encoded (envs.prepare_data)
    eval_rows: list[dict]
    data_notes: dict[str, float]
    mixture: list = field(default_factory=list)  # a task mixture's tasks with their rows (`envs.mixture`); [] for one task
    model: Any = None  # None when built without weights
    engine: Any = None  # None when built without weights or without an engine


def build_pieces(cfg: Config, model=None, tokenizer=None, *, weights: bool = True, engine: bool = True,
                 trains: bool = False, before_model: Callable[[Pieces], None] | None = None) -> Pieces:
    """Resolve `trainer.device` (a missing CUDA device fails first), load the tokenizer and the task's
    encoded rows, then the model, moved to that device, and the engine `rollout.engine` over it.

    `model` / `tokenizer`: objects to use instead of loading `model.path`. `weights=False` stops after the
    data (no model, no engine); `engine=False` after the model. `trains`: the model is to be trained, so
    torch is seeded with `trainer.seed` before it loads, it gets its LoRA adapters (`model.lora`), and
    under bf16 autocast a LoRA model's frozen base is kept in bf16 (`models.lora.frozen_base_in_bf16`).
    `before_model(pieces)` runs once the data are loaded, before any weights load (checks of the rows
    fail there, fast)."""
    device = resolve_device(cfg.trainer.device)
    if tokenizer is None:
        tokenizer = load_tokenizer(resolve_model_path(cfg.model.path))
    if cfg.mixture.tasks:
        mixture, task, notes = load_mixture(cfg, tokenizer)
        train, held = task.train, task.eval
    else:
        mixture, task = [], load_task(cfg.task)
        train, held, notes = prepare_data(cfg, tokenizer, task)
    pieces = Pieces(device=device, tokenizer=tokenizer, task=task, train_rows=train, eval_rows=held, data_notes=notes,
                    mixture=mixture)
    if before_model is not None:
        before_model(pieces)
    if not weights:
        return pieces
    if trains:
        torch.manual_seed(cfg.trainer.seed)
    if model is None:
        model = load_model(resolve_model_path(cfg.model.path))
    if trains and cfg.model.lora is not None and not is_peft(model):
        model = apply_lora(model, cfg.model.lora)
    pieces.model = model.to(device)
    if trains and is_peft(pieces.model) and resolve_bf16(cfg.trainer.bf16, device):
        frozen_base_in_bf16(pieces.model)
    if engine:
        pieces.engine = build_engine(cfg, pieces.model, tokenizer)
    return pieces
