"""Builds a run's roles (`roles:`, docs/roles.md) and keeps their state in the run's checkpoints.

Each role gets weights, an engine and, when it trains, a learner of its own objective and optimiser:

- `model: adapter`: its own LoRA adapter on the policy's base (multi-LoRA, no second copy of the model); the
  adapters take turns under one lock (`models.lora.AdapterSwitch`), so the policy's engine and learner always
  find theirs in place;
- `model: policy`: the policy's own weights and engine (self-play); its samples join the policy's update;
- a model argument: a model of its own (with its own tokenizer, and adapters when it sets `lora`).

Its client (`envs.roles.RoleClient`) is what environments and rewards call. A trained role's weights go into
each checkpoint under `roles/<name>/` (transformers- or peft-loadable), with its optimiser, scheduler, the
random states of its micro-batch shuffle and of its own rollouts, and its engine's version; `--resume` and a rollback read them back.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from lmrl.algos import Algorithm
from lmrl.config import Config, ConfigError, RoleConfig
from lmrl.engines import SamplingParams
from lmrl.engines.build import eos_ids
from lmrl.engines.hf import HFEngine
from lmrl.envs.roles import RoleClient, register_role_clients
from lmrl.learners import Learner
from lmrl.loading import role_config
from lmrl.models import load_model, load_tokenizer, resolve_model_path
from lmrl.models.lora import ADAPTER_FILE, AdapterSwitch, apply_lora
from lmrl.models.precision import resolve_bf16
from lmrl.models.weights import is_peft
from lmrl.rewards import RewardScorer


@dataclass
class Role:
    """One role of the run: its settings, its own config (`loading.role_config`), its client, and when it trains
    with weights of its own its learner, objective and scorer (`learner` None: frozen, or the policy's weights)."""

    name: str
    spec: RoleConfig
    cfg: Config
    client: RoleClient
    tokenizer: Any
    engine: Any
    model: Any = None
    learner: Learner | None = None
    algorithm: Algorithm | None = None
    scorer: RewardScorer | None = None
    adapter: str | None = None  # its adapter's name on the policy's base (model: adapter)
    switch: Any = contextlib.nullcontext  # puts its weights in place for a block
    pending: list = field(default_factory=list)  # the scored groups of this step it trains on (`loops.roles`)
    generator: torch.Generator | None = None  # draws its own rollouts of the step's prompts (`rollouts: true`)

    @property
    def joins_policy(self) -> bool:
        """Plays with the policy's weights: its scored samples are trained in the policy's update."""
        return self.spec.model == "policy"


def build_roles(cfg: Config, model, tokenizer, engine, device: torch.device) -> tuple[dict[str, Role], Any]:
    """The run's roles, their clients registered for the environments; and the policy's engine to use (the
    policy's, generating with its own adapter in place when roles share its base)."""
    if not cfg.roles:
        return {}, engine
    switch = AdapterSwitch(model) if any(r.model == "adapter" for r in cfg.roles.values()) else None
    if switch is not None and not is_peft(model):
        raise ConfigError("roles with model=adapter need the policy's model to carry LoRA adapters (model.lora)")
    roles = {name: _build_role(name, cfg, model, tokenizer, engine, device, switch) for name in cfg.roles}
    for index, role in enumerate(roles.values()):
        if role.spec.rollouts:
            if role.tokenizer.get_vocab() != tokenizer.get_vocab():
                raise ConfigError(f"roles.{role.name}.rollouts: its model's tokenizer is not the policy's; a role "
                                  "that rolls out the run's prompts reads their token ids")
            role.generator = torch.Generator().manual_seed(cfg.trainer.seed + 1 + index)
    register_role_clients({name: role.client for name, role in roles.items()})
    return roles, engine if switch is None else SwitchedEngine(engine, lambda: switch.use("default"))


def _build_role(name: str, cfg: Config, model, tokenizer, engine, device, switch: AdapterSwitch | None) -> Role:
    spec, own = cfg.roles[name], role_config(cfg, name)
    params = SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature)
    if spec.model == "policy":
        engine_switch = (lambda: switch.use("default")) if switch is not None else contextlib.nullcontext
        client = RoleClient(name, engine, tokenizer, params, trains=True, switch=engine_switch)
        return Role(name, spec, own, client, tokenizer, engine, scorer=RewardScorer(own.reward),
                    switch=engine_switch)
    if spec.model == "adapter":
        switch.add(name, own.model.lora)
        role_model, role_tokenizer = model, tokenizer
        use = lambda: switch.use(name)  # noqa: E731
    else:
        path = resolve_model_path(spec.model)
        role_model, role_tokenizer = load_model(path).to(device), load_tokenizer(path)
        if own.model.lora is not None:
            role_model = apply_lora(role_model, own.model.lora)
        use = contextlib.nullcontext
        if not spec.trains:
            role_model.eval().requires_grad_(False)
    pad = role_tokenizer.pad_token_id if role_tokenizer.pad_token_id is not None else role_tokenizer.eos_token_id
    bf16 = resolve_bf16(own.trainer.bf16, device)  # as the policy's: a LoRA base kept in bf16 runs under autocast
    role_engine = HFEngine(role_model, eos_ids(role_tokenizer, role_model), pad, bf16=bf16)
    client = RoleClient(name, role_engine, role_tokenizer, params, trains=spec.trains, switch=use)
    role = Role(name, spec, own, client, role_tokenizer, role_engine, role_model, switch=use,
                adapter=name if spec.model == "adapter" else None)
    if spec.trains:
        role.algorithm = Algorithm(own.algo, own.rollout.max_new_tokens)
        with use():  # its learner trains what is trainable now: its adapter, or its own model
            role.learner = Learner(role_model, own.trainer, spec.temperature, needs_reference=True, bf16=bf16,
                                   critic=role.algorithm.critic, critic_lr=own.algo.critic_lr)
        role.scorer = RewardScorer(own.reward)
    return role


class SwitchedEngine:
    """An engine whose generation runs with `switch()` in place: the policy's adapter, under the lock of the base
    its roles share. Everything else is the engine's own."""

    def __init__(self, engine, switch):
        self.engine, self.switch = engine, switch

    def generate(self, *args, **kwargs):
        with self.switch():
            return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


def write_roles(roles: dict[str, Role], checkpoint: Path) -> None:
    """Each trained role's state under `checkpoint/roles/<name>/`: its weights (`model/`, a transformers directory,
    or peft's adapter files), optimiser and scheduler (`optim.pt`), its shuffle's random state, its engine's version
    and its scorer's state (`state.pt`)."""
    for name, role in roles.items():
        if role.learner is None:
            continue
        where = checkpoint / "roles" / name
        where.mkdir(parents=True)
        role.model.save_pretrained(where / "model", safe_serialization=True,
                                   **({"selected_adapters": [name]} if role.adapter is not None else {}))
        role.tokenizer.save_pretrained(where / "model" / (name if role.adapter is not None else ""))
        learner = role.learner
        torch.save({"optimizer": learner.optimizer.state_dict(), "scheduler": learner.scheduler.state_dict()},
                   where / "optim.pt")
        torch.save({"shuffle": learner.shuffle.get_state(), "version": role.engine.version,
                    "rollout": None if role.generator is None else role.generator.get_state(),
                    "optimizer_steps": learner.optimizer_steps, "rewards": role.scorer.state_dict()}, where / "state.pt")


def read_roles(roles: dict[str, Role], checkpoint: Path) -> None:
    """Put back what `write_roles` wrote into `checkpoint`: every trained role's weights and state."""
    from peft import set_peft_model_state_dict

    for name, role in roles.items():
        if role.learner is None:
            continue
        where = checkpoint / "roles" / name
        if not where.exists():
            raise RuntimeError(f"checkpoint {checkpoint} holds no state of role {name!r}; it cannot be restored")
        if role.adapter is not None:
            weights = load_file(str(where / "model" / name / ADAPTER_FILE))
            set_peft_model_state_dict(role.model, weights, adapter_name=name)
        elif is_peft(role.model):
            set_peft_model_state_dict(role.model, load_file(str(where / "model" / ADAPTER_FILE)))
        else:
            loaded = load_model(where / "model").state_dict()
            with torch.no_grad():
                for key, value in role.model.state_dict().items():
                    value.copy_(loaded[key])
        optim = torch.load(where / "optim.pt", weights_only=False)
        role.learner.optimizer.load_state_dict(optim["optimizer"])
        role.learner.scheduler.load_state_dict(optim["scheduler"])
        state = torch.load(where / "state.pt", weights_only=False)
        role.learner.shuffle.set_state(state["shuffle"])
        if role.generator is not None:
            role.generator.set_state(state["rollout"])
        role.learner.optimizer_steps = state["optimizer_steps"]
        role.engine.version = state["version"]
        role.scorer.load_state_dict(state["rewards"])
