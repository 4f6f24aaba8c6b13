"""Stage "combinations", the methods: what the estimator, the loss, the terms and the preset declare, against the rest
of the config (clip bounds, aggregation, sequence ratios, KL, groups, critic, inputs); and the row fields the methods read
(stage "data")."""
from __future__ import annotations

from lmrl.algos import ADVANTAGES, LOSSES
from lmrl.algos.shapers import SHAPERS
from lmrl.algos.terms import TERMS, listed_term
from lmrl.config import Config, ConfigError
from lmrl.inputs import provided_inputs
from lmrl.inputs.vocabulary import ALIASES, ROW_FIELD_INPUTS, STEP_FIELDS, pmi_field, unknown_inputs_message
from lmrl.presets import PRESETS


# Row fields the loop adds only when a setting asks for them: field -> that setting.
SETTING_FIELDS = {"prompt_variant": "task.prompt_variants"}


def _preset_clip_bounds(cfg: Config) -> None:
    """A preset's sequence-ratio clip bounds (GSPO's 3e-4/4e-4) clip almost every token of a token-ratio loss."""
    a, brought = cfg.algo, PRESETS.get(cfg.algo.preset).settings
    preset_loss = brought.get("algo.loss")
    if preset_loss not in LOSSES or not LOSSES.spec(preset_loss).sequence_ratio or LOSSES.spec(a.loss).sequence_ratio:
        return
    bounds = [key for key in ("algo.eps_low", "algo.eps_high") if key in brought]
    if any(cfg.inherited(key) for key in bounds):
        shown = ", ".join(f"{key}={brought[key]:g}" for key in bounds)
        raise ConfigError(f"algo.preset={a.preset} brings sequence-ratio clip bounds ({shown}) but algo.loss={a.loss} "
                          "clips token ratios with them, which clips almost every token; set algo.eps_low and "
                          "algo.eps_high explicitly (e.g. 0.2 / 0.2)")


def _preset_aggregation(cfg: Config) -> None:
    """A loss chosen without its aggregation must not silently take a preset's different one."""
    a = cfg.algo
    wanted = LOSSES.spec(a.loss).default_aggregation
    if not wanted or not cfg.inherited("algo.aggregation") or a.aggregation == wanted:
        return
    own = [n for n in PRESETS.names() if PRESETS.get(n).settings.get("algo.loss") == a.loss
           and PRESETS.get(n).settings.get("algo.aggregation") == wanted]
    use = f"use algo.preset={' or '.join(own)}, or " if own else ""
    raise ConfigError(f"algo.loss={a.loss} is defined with algo.aggregation={wanted}, but algo.preset={a.preset} "
                      f"brings algo.aggregation={a.aggregation}; {use}set algo.aggregation yourself ({wanted} as "                       f"in the paper, or {a.aggregation} to keep it)")


def _sequence_ratio(cfg: Config) -> None:
    """Dual-clip bounds a token ratio; a loss with one ratio per sequence has none."""
    if LOSSES.spec(cfg.algo.loss).sequence_ratio and cfg.algo.dual_clip is not None:
        raise ConfigError(f"algo.loss={cfg.algo.loss} is a sequence-level ratio; algo.dual_clip applies to "                           "token ratios only")


def _kl_in_reward(cfg: Config) -> None:
    """Folding the KL into the reward with a zero coefficient folds nothing: surely a mistake."""
    if cfg.algo.kl_in_reward and cfg.algo.kl_coef == 0:
        raise ConfigError("algo.kl_in_reward=true needs algo.kl_coef > 0")


def _groups(cfg: Config) -> None:
    """Group-relative estimators and group filters compare the samples of one prompt."""
    if ADVANTAGES.spec(cfg.algo.advantage).group_relative and cfg.rollout.group_size < 2:
        raise ConfigError(f"algo.advantage={cfg.algo.advantage} compares samples of one prompt; "                           "rollout.group_size must be >= 2")
    if cfg.data.group_filter != "none" and cfg.rollout.group_size < 2:
        raise ConfigError("data.group_filter needs rollout.group_size >= 2")


def _declared_checks(cfg: Config) -> None:
    """Each listed term's check of its settings and each shaper's of its knobs, against the run (`check`)."""
    for i, t in enumerate(cfg.algo.terms):
        check = TERMS.spec(t.name).check
        listed = listed_term(t.name, t.coef, t.params)
        problem = check(cfg, **listed.knobs, **listed.settings) if check is not None else None
        if problem:
            raise ConfigError(f"algo.terms[{i}] ({t.name}): {problem}")
    for i, s in enumerate(cfg.algo.shaping):
        check = SHAPERS.spec(s.name).check
        problem = check(cfg, **s.params) if check is not None else None
        if problem:
            raise ConfigError(f"algo.shaping[{i}] ({s.name}): {problem}")


def _critic(cfg: Config) -> None:
    """A critic-based estimator needs the value head, and the value head needs a critic-based estimator."""
    a = cfg.algo
    reads_values = ADVANTAGES.spec(a.advantage).critic
    if reads_values and not a.critic:
        raise ConfigError(f"algo.advantage={a.advantage} is critic-based (it reads a value head's values) but "
                          "algo.critic=false; set algo.critic=true or choose an estimator without a critic")
    if a.critic and not reads_values:
        critics = [n for n, spec in ADVANTAGES.specs().items() if spec.critic]
        raise ConfigError(f"algo.critic=true trains a value head that algo.advantage={a.advantage} never reads; "
                          f"choose a critic-based estimator ({', '.join(critics)}) or set algo.critic=false")


def _inputs(cfg: Config) -> None:
    """Every input a method declares must be one the loop provides (reward components: at least two), and
    every input an active term or shaper reads one a provider fills or the step itself does
    (`inputs.vocabulary.STEP_FIELDS`); an unknown one is named with the nearest known name."""
    a, provided = cfg.algo, provided_inputs()
    for setting, spec in ((f"algo.advantage={a.advantage}", ADVANTAGES.spec(a.advantage)),
                          (f"algo.loss={a.loss}", LOSSES.spec(a.loss))):
        missing = spec.requires - provided
        if missing:
            raise ConfigError(f"{setting} needs per-sample inputs {sorted(missing)} that the training loop does not "
                              f"provide yet ({unknown_inputs_message(missing, provided)}); it is available as a "
                              "function in lmrl.algos")
        components = sorted(n for n in spec.requires if ALIASES.get(n, n) == "reward_components")
        if components and len(cfg.reward.components) < 2:
            raise ConfigError(f"{setting} needs per-sample inputs {components} from at least 2 reward components to "                               f"combine; reward.components has {[c.name for c in cfg.reward.components]}")
    for i, t in enumerate(a.terms):
        missing = TERMS.spec(t.name).provided - provided
        if missing:
            raise ConfigError(f"algo.terms[{i}] ({t.name}) needs per-sample inputs {sorted(missing)} that no input "
                              "provider fills")
    known = provided | STEP_FIELDS
    readers = [(f"algo.terms[{i}] ({t.name})", TERMS.spec(t.name).inputs) for i, t in enumerate(a.terms)]
    readers += [(f"algo.shaping[{i}] ({s.name})", SHAPERS.spec(s.name).inputs) for i, s in enumerate(a.shaping)]
    for setting, inputs in readers:
        if inputs - known:
            raise ConfigError(f"{setting} reads inputs that no provider fills: "
                              f"{unknown_inputs_message(inputs - known, known)}")


def _rejected_tokens(cfg: Config) -> None:
    """Keeping rejected tokens means something only for a loss that declares a token mask."""
    if cfg.algo.rejected_tokens == "keep" and LOSSES.spec(cfg.algo.loss).token_mask is None:
        raise ConfigError(f"algo.rejected_tokens=keep only applies to losses that reject tokens; "                           f"algo.loss={cfg.algo.loss} rejects none")


def _method_rows(cfg: Config, rows: list[dict]) -> None:
    """Task row fields the estimator, the loss and `algo.group_by` read must be in every training row."""
    a, estimator = cfg.algo, ADVANTAGES.spec(cfg.algo.advantage)
    readers = {name: f"algo.loss={a.loss}" for name in LOSSES.spec(a.loss).requires & ROW_FIELD_INPUTS}
    readers.update({name: f"algo.advantage={a.advantage}" for name in estimator.requires & ROW_FIELD_INPUTS})
    if "pmi" in estimator.requires:
        readers[pmi_field(a.advantage_params)] = f"algo.advantage={a.advantage}"
    if a.group_by:
        readers[a.group_by] = "algo.group_by"
    for name in sorted(readers):
        lacking = sum(name not in r for r in rows)
        if lacking and name in SETTING_FIELDS:
            setting = SETTING_FIELDS[name]
            presets = [n for n in PRESETS.names() if setting in PRESETS.get(n).settings]
            hint = f" (the {' / '.join(presets)} preset sets one)" if presets else ""
            raise ConfigError(f"{readers[name]} reads the row field {name!r}, which only the rollouts of {setting} "                               f"carry; set {setting}{hint}")
        if lacking:
            raise ConfigError(f"{readers[name]} reads the task field {name!r}, which {lacking} of {len(rows)} "
                              "training rows lack")
