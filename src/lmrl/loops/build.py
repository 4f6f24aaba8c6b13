"""Builds the stages from a Config, and checks every registry name before anything heavy loads."""
from __future__ import annotations

import inspect

from lmrl.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, LOSSES
from lmrl.algos.inputs import ALIASES, INPUT_KNOBS, MODEL_OUTPUTS, ROW_FIELD_INPUTS
from lmrl.algos.state import state_knobs
from lmrl.config import Config, ConfigError
from lmrl.data import GROUP_FILTERS, SAMPLERS
from lmrl.data.demonstrations import template_fields
from lmrl.engines import ENGINES
from lmrl.envs import TASKS
from lmrl.loops.pmi import pmi_field
from lmrl.loops.trackers import check_trackers
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_AGGREGATIONS, REWARD_FNS


# Inputs the synchronous loop provides to estimators and losses (see `lmrl.algos.inputs`): per-token
# and per-row `extras`, `row_extras` (reward components, task row fields), `context` (step, total
# steps, batch entropy), and model outputs the learner computes.
LOOP_INPUTS = ({"acc", "group_acc", "rollout_logp", "ref_logp", "old_logp", "reward_components", "step",
                "total_steps", "entropy", "acoustic_rewards", "speech_mask", "pmi"}
               | set(ALIASES) | MODEL_OUTPUTS | ROW_FIELD_INPUTS)


def _unknown_knobs(fn, given: dict) -> list[str]:
    """Knobs a function would silently ignore: its catch-all is named `_` and it has no such parameter."""
    params = inspect.signature(fn).parameters
    catch_all = [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    if catch_all and catch_all[0].name != "_":
        return []
    return sorted(k for k in given if k not in params and k not in INPUT_KNOBS and k not in state_knobs(fn))


def check_combinations(cfg: Config) -> None:
    """Choices that are each valid but do not fit together; the message names both settings."""
    a = cfg.algo
    estimator, loss = ADVANTAGES.get(a.advantage), LOSSES.get(a.loss)
    if getattr(estimator, "critic", False) and not a.critic:
        raise ConfigError(f"algo.advantage={a.advantage} is critic-based (it reads a value head's values) but "
                          "algo.critic=false; set algo.critic=true or choose an estimator without a critic")
    if a.critic and not getattr(estimator, "critic", False):
        critics = [n for n in ADVANTAGES.names() if getattr(ADVANTAGES.get(n), "critic", False)]
        raise ConfigError(f"algo.critic=true trains a value head that algo.advantage={a.advantage} never reads; "
                          f"choose a critic-based estimator ({', '.join(critics)}) or set algo.critic=false")
    unknown = _unknown_knobs(loss, {**a.loss_params})
    if unknown:
        raise ConfigError(f"algo.loss_params: {unknown} are not knobs of algo.loss={a.loss} (they would be ignored; "
                          f"e.g. token-level mask knobs do not apply to a sequence-ratio loss)")
    unknown = _unknown_knobs(estimator, a.advantage_params)
    if unknown:
        raise ConfigError(f"algo.advantage_params: {unknown} are not knobs of algo.advantage={a.advantage}")
    if a.rejected_tokens == "keep" and getattr(loss, "token_mask", None) is None:
        raise ConfigError(f"algo.rejected_tokens=keep only applies to losses that reject tokens; "
                          f"algo.loss={a.loss} rejects none")


PER_SAMPLE_AGGREGATIONS = {"weighted_sum", "bottleneck", "gated"}


def check_demonstrations(cfg: Config) -> None:
    """A demonstration is scored on its own: every reward part it meets must be per sample."""
    if cfg.data.demonstrations == "none":
        return
    group = [c.name for c in cfg.reward.components if c.name in GROUP_REWARD_FNS]
    if group:
        raise ConfigError(f"data.demonstrations={cfg.data.demonstrations} scores each demonstration alone, but the "
                          f"reward components {group} score whole groups; use per-sample components")
    if cfg.reward.aggregation not in PER_SAMPLE_AGGREGATIONS:
        raise ConfigError(f"data.demonstrations={cfg.data.demonstrations} scores each demonstration alone, but "
                          f"reward.aggregation={cfg.reward.aggregation} normalises within a group; use one of "
                          f"{sorted(PER_SAMPLE_AGGREGATIONS)}")


def check_row_fields(cfg: Config, rows: list[dict]) -> None:
    """Task row fields the algorithm reads (and `algo.group_by`) must be present in every training row."""
    fields = (getattr(ADVANTAGES.get(cfg.algo.advantage), "requires", set()) | getattr(
        LOSSES.get(cfg.algo.loss), "requires", set())) & ROW_FIELD_INPUTS
    if cfg.algo.group_by:
        fields.add(cfg.algo.group_by)
    if "pmi" in getattr(ADVANTAGES.get(cfg.algo.advantage), "requires", set()):
        fields.add(pmi_field(cfg.algo.advantage_params))
    if cfg.data.demonstrations == "peers":
        lacking = sum(not isinstance(r.get(cfg.task.peer_rollouts), list) for r in rows)
        if lacking:
            raise ConfigError(f"task.peer_rollouts={cfg.task.peer_rollouts!r}: {lacking} task rows lack that field "
                              f"as a list of {{'text': ..., 'logprob': ...}} (they have: {', '.join(sorted(rows[0]))})")
    elif cfg.data.demonstrations != "none":
        missing = sorted(n for n in template_fields(cfg.task.demonstration) if any(n not in r for r in rows))
        if missing:
            raise ConfigError(f"task.demonstration={cfg.task.demonstration!r} reads the row fields {missing}, which "
                              f"some task rows lack (they have: {', '.join(sorted(rows[0]))})")
    for name in sorted(fields):
        lacking = sum(name not in r for r in rows)
        if lacking and name == "prompt_variant":
            raise ConfigError(f"algo.loss={cfg.algo.loss} reads the row field 'prompt_variant', which only the "
                              "rollouts of task.prompt_variants carry; set task.prompt_variants (the policy_split "
                              "preset sets one exploration instruction)")
        if lacking:
            raise ConfigError(f"algo.advantage={cfg.algo.advantage} / algo.group_by reads the task field {name!r}, "
                              f"which {lacking} of {len(rows)} training rows lack")


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
    for key, fn in (("algo.advantage", ADVANTAGES.get(cfg.algo.advantage)), ("algo.loss", LOSSES.get(cfg.algo.loss))):
        missing = set(getattr(fn, "requires", set())) - LOOP_INPUTS
        if missing:
            raise ConfigError(f"{key}={getattr(cfg.algo, key.split('.')[1])} needs per-sample inputs {sorted(missing)} "
                              "that the training loop does not provide yet; it is available as a function in lmrl.algos")
        components = sorted(n for n in getattr(fn, "requires", set()) if ALIASES.get(n, n) == "reward_components")
        if components and len(cfg.reward.components) < 2:
            raise ConfigError(f"{key}={getattr(cfg.algo, key.split('.')[1])} needs per-sample inputs {components} from "
                              f"at least 2 reward components to combine; reward.components has "
                              f"{[c.name for c in cfg.reward.components]}")
    check_combinations(cfg)
    check_demonstrations(cfg)
    check_trackers(cfg.run.trackers)
    names = [c.name for c in cfg.reward.components]
    if len(set(names)) != len(names):
        raise ConfigError(f"reward.components: each component may appear once (got {names})")
    if cfg.reward.accuracy_component not in names:
        raise ConfigError(f"reward.accuracy_component={cfg.reward.accuracy_component!r} is not one of "
                          f"reward.components ({', '.join(names)})")
