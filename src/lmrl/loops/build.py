"""Builds the stages from a Config, and checks every registry name before anything heavy loads."""
from __future__ import annotations

from lmrl.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, LOSSES
from lmrl.config import Config, ConfigError
from lmrl.data import GROUP_FILTERS, SAMPLERS
from lmrl.engines import ENGINES
from lmrl.envs import TASKS
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_AGGREGATIONS, REWARD_FNS


# Per-sample inputs the synchronous loop puts into `Batch.extras` for estimators and losses.
LOOP_INPUTS = {"acc", "group_acc", "rollout_logp", "ref_logp", "old_logp"}


def check_names(cfg: Config) -> None:
    """Every name in the config must be registered; the error names the key and the nearest name."""
    checks = [
        ("algo.advantage", ADVANTAGES, cfg.algo.advantage),
        ("algo.loss", LOSSES, cfg.algo.loss),
        ("algo.aggregation", AGGREGATIONS, cfg.algo.aggregation),
        ("algo.kl_estimator", KL_ESTIMATORS, cfg.algo.kl_estimator),
        ("task.name", TASKS, cfg.task.name),
        ("rollout.engine", ENGINES, cfg.rollout.engine),
        ("data.sampler", SAMPLERS, cfg.data.sampler),
        ("data.group_filter", GROUP_FILTERS, cfg.data.group_filter),
        ("reward.aggregation", REWARD_AGGREGATIONS, cfg.reward.aggregation),
    ]
    checks += [(f"reward.components[{i}].name", GROUP_REWARD_FNS if c.name in GROUP_REWARD_FNS else REWARD_FNS, c.name)
               for i, c in enumerate(cfg.reward.components)]
    for key, registry, name in checks:
        if name not in registry:
            raise ConfigError(f"{key}: {registry.unknown_message(name)}")
    missing = getattr(ADVANTAGES.get(cfg.algo.advantage), "requires", set()) - LOOP_INPUTS
    if missing:
        raise ConfigError(f"algo.advantage={cfg.algo.advantage} needs per-sample inputs {sorted(missing)} that the "
                          "training loop does not provide yet; it is available as a function in lmrl.algos")
    names = [c.name for c in cfg.reward.components]
    if len(set(names)) != len(names):
        raise ConfigError(f"reward.components: each component may appear once (got {names})")
    if cfg.reward.accuracy_component not in names:
        raise ConfigError(f"reward.accuracy_component={cfg.reward.accuracy_component!r} is not one of "
                          f"reward.components ({', '.join(names)})")
