"""Stage "names" of the validation pipeline: every registry key in the config resolves (user code `file.py:name` too), reward and tracker names are known, and every knob is one its method declares."""
from __future__ import annotations

import inspect
from typing import Any

from lmrl.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, LOSSES
from lmrl.algos.shapers import KEYED_SHAPERS, SHAPERS
from lmrl.algos.state import state_knobs
from lmrl.algos.terms import KEYED_TERMS, TERMS
from lmrl.config import Config, ConfigError
from lmrl.data import BATCH_SOURCES, GROUP_FILTERS, SAMPLERS
from lmrl.data.samplers import RUN_ARGUMENTS
from lmrl.data.demonstrations import SAMPLE_SOURCES
from lmrl.engines import ENGINES
from lmrl.engines.weight_sync import WEIGHT_TRANSPORTS
from lmrl.envs import ENVIRONMENTS, TASKS
from lmrl.inputs.vocabulary import INPUT_KNOBS
from lmrl.presets import PRESETS
from lmrl.registry import KnobError, check_knobs
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_AGGREGATIONS, REWARD_FNS
from lmrl.rewards.compute import owner_of
from lmrl.trackers import check_trackers


def _registered(cfg: Config) -> None:
    """Every name in the config must be registered; the error names the key and the nearest name."""
    a = cfg.algo
    checks = [("algo.preset", PRESETS, a.preset), ("algo.advantage", ADVANTAGES, a.advantage),
              ("algo.loss", LOSSES, a.loss), ("algo.aggregation", AGGREGATIONS, a.aggregation),
              ("algo.kl_estimator", KL_ESTIMATORS, a.kl_estimator), ("task.name", TASKS, cfg.task.name),
              ("rollout.engine", ENGINES, cfg.rollout.engine), ("data.sampler", SAMPLERS, cfg.data.sampler),
              ("rollout.weight_transport", WEIGHT_TRANSPORTS, cfg.rollout.weight_transport),
              ("data.group_filter", GROUP_FILTERS, cfg.data.group_filter),
              ("data.demonstrations", SAMPLE_SOURCES, cfg.data.demonstrations),
              ("batches.source", BATCH_SOURCES, cfg.batches.source),
              ("reward.aggregation", REWARD_AGGREGATIONS, cfg.reward.aggregation)]
    checks += [(f"reward.components[{i}].name", GROUP_REWARD_FNS if c.name in GROUP_REWARD_FNS else REWARD_FNS, c.name)
               for i, c in enumerate(cfg.reward.components)]
    if cfg.env.name is not None:  # without one the task is single-turn
        checks.append(("env.name", ENVIRONMENTS, cfg.env.name))
    extras = [("algo.terms", a.terms, TERMS, KEYED_TERMS, "term"),
              ("algo.shaping", a.shaping, SHAPERS, KEYED_SHAPERS, "shaper")]
    checks += [(f"{key}[{i}].name", registry, e.name) for key, entries, registry, _, _ in extras
               for i, e in enumerate(entries)]
    for key, registry, name in checks:
        if name not in registry:
            raise ConfigError(f"{key}: {registry.unknown_message(name)}")
    for key, entries, _, keyed, kind in extras:  # a term or shaper the config keys switch on is not added twice
        for i, e in enumerate(entries):
            if e.name in keyed:
                raise ConfigError(f"{key}[{i}].name: the {e.name!r} {kind} is switched on by {keyed[e.name]}")
            if e.name in [earlier.name for earlier in entries[:i]]:
                raise ConfigError(f"{key}[{i}].name: the {e.name!r} {kind} is listed twice; give it once "
                                  "(entries are changed by name)")


def _reward_names(cfg: Config) -> None:
    """Components are logged and weighed by name: each once, and the accuracy one among them."""
    names = [c.name for c in cfg.reward.components]
    if len(set(names)) != len(names):
        raise ConfigError(f"reward.components: each component may appear once (got {names})")
    if owner_of(cfg.reward.accuracy_component, names) is None:
        raise ConfigError(f"reward.accuracy_component={cfg.reward.accuracy_component!r} is not one of "
                          f"reward.components ({', '.join(names)}) nor a named part of one (`name/part`)")


def _trackers(cfg: Config) -> None:
    """Trackers registered and their packages installed, before a run starts (trackers.py)."""
    check_trackers(cfg.run.trackers)


def _knob_sites(cfg: Config) -> list[tuple[str, Any, str, dict, dict]]:
    """(config key, registry, entry name, knobs, how the caller binds them) for every component that takes params."""
    a, r = cfg.algo, cfg.reward
    sites = []
    for i, c in enumerate(r.components):
        registry = GROUP_REWARD_FNS if c.name in GROUP_REWARD_FNS else REWARD_FNS
        built = inspect.isclass(registry.get(c.name))  # a stateful component is built from its params alone
        sites.append((f"reward.components[{i}].params", registry, c.name, c.params, {"passed": 0 if built else 1}))
    sites += [
        ("reward.aggregation_params", REWARD_AGGREGATIONS, r.aggregation, r.aggregation_params, {"passed": 2}),
        ("data.sampler_params", SAMPLERS, cfg.data.sampler, cfg.data.sampler_params,          {"passed": 1, "supplied": RUN_ARGUMENTS[1:]}),
        ("algo.loss_params", LOSSES, a.loss, a.loss_params,
         {"passed": 1, "supplied": ("eps_low", "eps_high", "dual_clip"), "complete": False,
          "consumed": INPUT_KNOBS | set(state_knobs(LOSSES.spec(a.loss)))}),
        ("algo.advantage_params", ADVANTAGES, a.advantage, a.advantage_params,
         {"passed": 3, "complete": False, "consumed": INPUT_KNOBS | set(state_knobs(ADVANTAGES.spec(a.advantage)))}),
    ]
    sites += [(f"algo.terms[{i}].params", TERMS, t.name, t.params,
               {"passed": 2, "consumed": set(TERMS.spec(t.name).settings)}) for i, t in enumerate(a.terms)]
    sites += [(f"algo.shaping[{i}].params", SHAPERS, s.name, s.params, {"passed": 2})
              for i, s in enumerate(a.shaping)]
    if cfg.env.name:  # a registered instance takes no params: any given is unknown
        sites.append(("env.params", ENVIRONMENTS, cfg.env.name, cfg.env.params, {}))
    return sites


def _params(cfg: Config) -> None:
    """Every component's params bind to its signature as the run calls it: a misspelt knob fails here,
    naming the nearest valid one, not on every sample at run time (registry.check_knobs). An entry that
    defines `check_params(**knobs)` (a stateful reward built at run start) checks their values here too."""
    for key, registry, name, knobs, binding in _knob_sites(cfg):
        try:
            registry.check_knobs(name, knobs, **binding)
            check_values = getattr(registry.get(name), "check_params", None)
            if check_values is not None:
                check_values(**knobs)
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None
    record = SAMPLE_SOURCES.spec(cfg.data.demonstrations).params
    if record is not None:
        try:
            check_knobs(record, cfg.data.source_params, f"data.demonstrations={cfg.data.demonstrations}")
        except KnobError as err:
            raise ConfigError(f"data.source_params: {err}") from None
