"""What a run with `roles:` runs with (docs/roles.md): checked before any model loads, each role named."""
from __future__ import annotations

import re

from lmrl.config import Config, ConfigError

ROLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _roles(cfg: Config) -> None:
    """Role names, the shared base a role's adapter needs, and the loop a run of roles uses: one process, the
    synchronous loop with in-process `hf` engines, one task."""
    if cfg.trainer.train_steps == [] and not any(role.trains and role.model != "policy"
                                                 for role in cfg.roles.values()):
        raise ConfigError("trainer.train_steps=[]: the policy does not train, and no role with weights of its own does "
                          "(roles.<name>.trains with model adapter or a model of its own): nothing would learn")
    if not cfg.roles:
        return
    for name, role in cfg.roles.items():
        if not ROLE_NAME.match(name) or name in ("policy", "default"):
            raise ConfigError(f"roles: {name!r} is not a role name (a letter, then letters, digits or _; "
                              "'policy' and 'default' are the run's own policy)")
        if role.model == "adapter" and cfg.model.lora is None:
            raise ConfigError(f"roles.{name}.model=adapter gives the role its own LoRA adapter on the policy's base: "
                              "it needs model.lora (the policy's adapters); or give the role a model of its own "
                              f"(roles.{name}.model=default or a path)")
        if role.model == "policy" and not role.trains:
            raise ConfigError(f"roles.{name}: model=policy plays the policy's own weights, which train with the "
                              "policy: set trains=true, or give a frozen role a model of its own")
        if role.rollouts and (not role.trains or role.model == "policy"):
            raise ConfigError(f"roles.{name}.rollouts: a peer that rolls out the step's prompts trains on them with "
                              "weights of its own: set trains=true and model adapter or a model of its own")
        if role.model == "policy" and role.temperature != cfg.rollout.temperature:
            raise ConfigError(f"roles.{name}: model=policy trains in the policy's update, whose log-probs are at "
                              f"rollout.temperature={cfg.rollout.temperature}: set roles.{name}.temperature to it "
                              f"(now {role.temperature}), or the role's behaviour log-probs would not be the policy's")
        if role.trains and role.reward is None:
            raise ConfigError(f"roles.{name} trains but sets no reward (roles.{name}.reward.components) to score "
                              "its samples")
    problems = [what for what, bad in [
        ("rollout.max_staleness (the asynchronous loop)", cfg.rollout.max_staleness is not None),
        (f"rollout.engine={cfg.rollout.engine}", cfg.rollout.engine != "hf"),
        (f"dist.backend={cfg.dist.backend}", cfg.dist.backend != "none"),
        ("trainer.sharding=fsdp", cfg.trainer.sharding == "fsdp"),
        ("mixture.tasks", bool(cfg.mixture.tasks)),
        ("algo.guards", cfg.algo.guards.enabled)] if bad]
    if problems:
        raise ConfigError(f"a run with roles ({', '.join(cfg.roles)}) runs in one process with the synchronous loop "
                          f"and in-process hf engines, on one task, without guards; it does not run with "
                          f"{', '.join(problems)}")
