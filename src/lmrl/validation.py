"""The validation pipeline: every check of a Config, in one ordered list by stage, driven by declarations.

Stage "names": every registry key resolves (user code `file.py:name` too). Stage "combinations":
what the estimator and the loss declare (`AdvantageSpec`, `LossSpec`) and what the preset brought,
against the rest of the config. Stage "data": the task rows carry the fields the methods and
demonstrations read. `build_config` (so `load_config` and `lmrl train --dry-run`) runs the first two
through `check_names`; `build_stages` runs the last through `check_row_fields` once rows are loaded.
No check names a method: each reads the method's declaration. Pydantic keeps field types and ranges.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from lmrl.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, LOSSES
from lmrl.algos.shapers import KEYED_SHAPERS, SHAPERS, active_shapers
from lmrl.algos.state import state_knobs
from lmrl.algos.terms import KEYED_TERMS, TERMS, active_terms, listed_term
from lmrl.config import Config, ConfigError
from lmrl.data import BATCH_SOURCES, GROUP_FILTERS, SAMPLERS
from lmrl.data.sources import check_batches
from lmrl.data.samplers import RUN_ARGUMENTS
from lmrl.data.demonstrations import SAMPLE_SOURCES, source_params, template_fields
from lmrl.engines import ENGINES
from lmrl.engines.weight_sync import WEIGHT_TRANSPORTS
from lmrl.envs import ENVIRONMENTS, TASKS
from lmrl.envs.controllers import check_controller
from lmrl.inputs import provided_inputs
from lmrl.inputs.vocabulary import (ALIASES, INPUT_KNOBS, ROW_FIELD_INPUTS, STEP_FIELDS, pmi_field,
                                    unknown_inputs_message)
from lmrl.presets import PRESETS
from lmrl.recipe_files import references
from lmrl.registry import KnobError, check_knobs
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_AGGREGATIONS, REWARD_FNS
from lmrl.trackers import check_trackers

# Row fields the loop adds only when a setting asks for them: field -> that setting.
SETTING_FIELDS = {"prompt_variant": "task.prompt_variants"}


# --- stage "names" -----------------------------------------------------------------------------


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


def _rollout_workers(cfg: Config) -> None:
    """Rollout workers are `hf` engines; engine servers host hf or vllm; learner ranks as actors need Ray
    (docs/scaling.md)."""
    d = cfg.dist
    if d.backend != "none" and cfg.rollout.engine != "hf" and not d.servers:
        raise ConfigError(f"dist.backend={d.backend} runs hf rollout workers; rollout.engine={cfg.rollout.engine} "
                          "runs in the learner's process or in engine servers: set dist.servers=true, or use "
                          "dist.backend=none with it")
    if (d.servers or d.server_devices or d.broadcast_changed or d.broadcast != "auto") and d.backend == "none":
        raise ConfigError("dist.servers and its settings need dist.backend=local (server processes on this "
                          "machine) or ray (Ray actors)")
    if d.server_devices and len(d.server_devices) != d.rollout_workers:
        raise ConfigError(f"dist.server_devices names {len(d.server_devices)} devices for "
                          f"dist.rollout_workers={d.rollout_workers} servers: give one per server")
    if d.servers and d.learner_ranks > 1:
        raise ConfigError("dist.servers serves one learner: keep dist.learner_ranks=1 with it")
    if d.learner_ranks > 1 and d.backend != "ray":
        raise ConfigError(f"dist.learner_ranks={d.learner_ranks} places learner ranks as Ray actors: set "
                          "dist.backend=ray (or launch the ranks with torchrun and keep dist.learner_ranks=1)")
    if d.learner_ranks > 1 and (cfg.rollout.max_staleness is not None or cfg.algo.guards.enabled):
        raise ConfigError("dist.learner_ranks > 1 (data-parallel ranks) uses the synchronous loop without guards: "
                          "unset rollout.max_staleness and keep algo.guards.enabled=false")


def _reward_names(cfg: Config) -> None:
    """Components are logged and weighed by name: each once, and the accuracy one among them."""
    names = [c.name for c in cfg.reward.components]
    if len(set(names)) != len(names):
        raise ConfigError(f"reward.components: each component may appear once (got {names})")
    if cfg.reward.accuracy_component not in names:
        raise ConfigError(f"reward.accuracy_component={cfg.reward.accuracy_component!r} is not one of "
                          f"reward.components ({', '.join(names)})")


def _env_reward(cfg: Config) -> None:
    """An environment's rewards reach training only through the `env` reward component."""
    if cfg.env.name and "env" not in {c.name for c in cfg.reward.components}:
        raise ConfigError(f"env.name={cfg.env.name!r} but reward.components has no `env` component, so the "
                          "environment's rewards would not reach training: add it, e.g. "
                          "\"reward.components=[{name: env}]\" reward.accuracy_component=env (weight 0 to only log it)")


def _trackers(cfg: Config) -> None:
    """Trackers registered and their packages installed, before a run starts (trackers.py)."""
    check_trackers(cfg.run.trackers)


# --- stage "combinations": declarations and the preset against the settings --------------------


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
                      f"brings algo.aggregation={a.aggregation}; {use}set algo.aggregation yourself ({wanted} as "
                      f"in the paper, or {a.aggregation} to keep it)")


def _sequence_ratio(cfg: Config) -> None:
    """Dual-clip bounds a token ratio; a loss with one ratio per sequence has none."""
    if LOSSES.spec(cfg.algo.loss).sequence_ratio and cfg.algo.dual_clip is not None:
        raise ConfigError(f"algo.loss={cfg.algo.loss} is a sequence-level ratio; algo.dual_clip applies to "
                          "token ratios only")


def _kl_in_reward(cfg: Config) -> None:
    """Folding the KL into the reward with a zero coefficient folds nothing: surely a mistake."""
    if cfg.algo.kl_in_reward and cfg.algo.kl_coef == 0:
        raise ConfigError("algo.kl_in_reward=true needs algo.kl_coef > 0")


def _stop_rules(cfg: Config) -> None:
    """A rule on a metric of the evaluation is read at each evaluation: the run must evaluate as it trains."""
    for rule in (r for r in cfg.trainer.stop_when if r.at_evaluation):
        if not cfg.eval.every or cfg.eval.every >= cfg.trainer.steps:
            raise ConfigError(f"trainer.stop_when reads {rule.metric} at each evaluation: set eval.every below "
                              f"trainer.steps={cfg.trainer.steps} (e.g. eval.every=2), or name a metric of the step")
        if cfg.task.num_eval == 0 and cfg.eval.num_prompts is None and not cfg.batches.num_eval:
            raise ConfigError(f"trainer.stop_when reads {rule.metric} at each evaluation, and task.num_eval=0 holds "
                              "no prompt out to evaluate")


def _groups(cfg: Config) -> None:
    """Group-relative estimators and group filters compare the samples of one prompt."""
    if ADVANTAGES.spec(cfg.algo.advantage).group_relative and cfg.rollout.group_size < 2:
        raise ConfigError(f"algo.advantage={cfg.algo.advantage} compares samples of one prompt; "
                          "rollout.group_size must be >= 2")
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


def _peers(cfg: Config) -> None:
    """Another policy's samples carry only a sequence log-prob, which only a sequence-level IS correction can use."""
    mode, field = cfg.data.demonstrations, SAMPLE_SOURCES.spec(cfg.data.demonstrations).peer_field
    if field is None:
        return
    if not getattr(cfg.task, field):
        raise ConfigError(f"data.demonstrations={mode} needs task.{field}, the task row field holding "
                          "[{'text': ..., 'logprob': ...}, ...]")
    loss, knobs, spec = cfg.algo.loss, cfg.algo.loss_params, LOSSES.spec(cfg.algo.loss)
    if not spec.weighs_sequences(knobs):
        usable = [n for n, s in LOSSES.specs().items() if s.sequence_is]
        which = f"algo.loss={loss} with algo.loss_params={knobs}" if spec.sequence_is else f"algo.loss={loss}"
        raise ConfigError(f"data.demonstrations={mode} weighs another policy's completions by the sequence ratio "
                          f"π_self(y)/π_peer(y), but {which} does not use it (token ratios do not exist across "
                          f"tokenizers); use algo.loss={' or '.join(usable) or '(none registered)'} with its "
                          "sequence-level knobs (docs/methods/demonstrations.md)")


def _demonstrations(cfg: Config) -> None:
    """Demonstrations need their template, fit the estimator, and are scored alone by per-sample rewards."""
    mode, a, spec = cfg.data.demonstrations, cfg.algo, SAMPLE_SOURCES.spec(cfg.data.demonstrations)
    if spec.template and not cfg.task.demonstration:
        raise ConfigError(f"data.demonstrations={mode} needs task.demonstration, a template over the task row's "
                          "fields (e.g. '{solution}' or 'Answer: {answer}')")
    _demonstration_script(cfg, spec.template)
    if not spec.in_advantage and a.critic:
        raise ConfigError(f"data.demonstrations={mode} leaves its rows out of the advantage estimate, which "
                          "algo.critic=true (value targets for every row) does not support; use group or no critic")
    for term in (t for t in a.terms if TERMS.spec(t.name).weights == "demonstration" and t.coef != 0):
        if mode == "none":
            raise ConfigError(f"algo.terms: the {term.name!r} term trains on demonstration rows, but "
                              "data.demonstrations=none adds none; set data.demonstrations=rescue (or group) and "
                              "task.demonstration")
    if not spec.scored_alone:
        return
    group = [c.name for c in cfg.reward.components if c.name in GROUP_REWARD_FNS]
    if group:
        raise ConfigError(f"data.demonstrations={mode} scores each demonstration alone, but the reward components "
                          f"{group} score whole groups; use per-sample components")
    if not REWARD_AGGREGATIONS.spec(cfg.reward.aggregation).per_sample:
        per_sample = sorted(n for n, agg in REWARD_AGGREGATIONS.specs().items() if agg.per_sample)
        raise ConfigError(f"data.demonstrations={mode} scores each demonstration alone, but "
                          f"reward.aggregation={cfg.reward.aggregation} normalises within a group; use one of "
                          f"{per_sample}")


def _sample_source(cfg: Config) -> None:
    """A source's knobs are its own; one that rolls out prompts of its own needs a single-turn task whose
    groups reach it unfiltered; one whose rows train only through the supervised term needs that term."""
    mode, spec, params = cfg.data.demonstrations, SAMPLE_SOURCES.spec(cfg.data.demonstrations), cfg.data.source_params
    if spec.params is None and params:
        raise ConfigError(f"data.source_params: data.demonstrations={mode} takes no knobs (got {sorted(params)})")
    try:
        knobs = source_params(cfg)
        if hasattr(knobs, "check"):
            knobs.check(cfg)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"data.source_params for data.demonstrations={mode}: {err}") from None
    if spec.generates and cfg.env.name and not spec.episodes:
        raise ConfigError(f"data.demonstrations={mode} rolls out extended prompts of a single-turn task; "
                          f"env.name={cfg.env.name!r} runs episodes")
    if spec.generates and cfg.data.group_filter != "none":
        raise ConfigError(f"data.demonstrations={mode} looks at the groups the filter keeps, and "
                          f"data.group_filter={cfg.data.group_filter} drops the hard ones first; set it to none")
    supervised = [t.name for t in cfg.algo.terms if TERMS.spec(t.name).weights == "demonstration" and t.coef != 0]
    if spec.supervised and not supervised:
        demo_terms = [n for n, term in TERMS.specs().items() if term.weights == "demonstration"]
        raise ConfigError(f"data.demonstrations={mode} adds rows that only a term over demonstration rows trains "
                          f"(λ_aux); add one to algo.terms, e.g. [{{name: {demo_terms[0]}, coef: 0.1}}]")


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
            raise ConfigError(f"{setting} needs per-sample inputs {components} from at least 2 reward components to "
                              f"combine; reward.components has {[c.name for c in cfg.reward.components]}")
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
        ("data.sampler_params", SAMPLERS, cfg.data.sampler, cfg.data.sampler_params,
         {"passed": 1, "supplied": RUN_ARGUMENTS[1:]}),
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


def _sampler_probe(cfg: Config) -> None:
    """A sampler that probes prompts with the current policy (`probes(**knobs)`) needs the synchronous loop."""
    sampler = SAMPLERS.get(cfg.data.sampler)
    probes = getattr(sampler, "probes", None)
    probing = probes(**cfg.data.sampler_params) if probes is not None else getattr(sampler, "needs_probe", False)
    if probing and cfg.rollout.max_staleness is not None:
        raise ConfigError(f"data.sampler={cfg.data.sampler} probes prompts with the learner's current policy, which "
                          "the asynchronous loop trains while rollouts run; use it without rollout.max_staleness")


def _rejected_tokens(cfg: Config) -> None:
    """Keeping rejected tokens means something only for a loss that declares a token mask."""
    if cfg.algo.rejected_tokens == "keep" and LOSSES.spec(cfg.algo.loss).token_mask is None:
        raise ConfigError(f"algo.rejected_tokens=keep only applies to losses that reject tokens; "
                          f"algo.loss={cfg.algo.loss} rejects none")


# --- stage "data": the loaded task rows ---------------------------------------------------------


def _demonstration_script(cfg: Config, sample_source: bool) -> None:
    """A list of templates is a worked episode's policy turns: only an environment's demonstrations batch source
    plays one, and it has no single completion to regenerate."""
    demo, played = cfg.task.demonstration, cfg.env.name is not None and cfg.batches.source == "demonstrations"
    if isinstance(demo, list) and not demo:
        raise ConfigError("task.demonstration is an empty list: give one template per policy turn")
    if isinstance(demo, list) and (not played or sample_source):
        raise ConfigError("task.demonstration is a list (one template per policy turn), which is a worked episode of "
                          "an environment: it needs env.name and batches.source=demonstrations"
                          + (f", not data.demonstrations={cfg.data.demonstrations}" if sample_source else "")
                          + "; elsewhere give one template")
    if played and cfg.batches.on_policy is not None:
        raise ConfigError("batches.on_policy regenerates one completion per row, but the worked episodes of "
                          f"env.name={cfg.env.name} are several turns; leave batches.on_policy unset")


def _demonstration_rows(cfg: Config, rows: list[dict]) -> None:
    """Peer rollouts and demonstration templates read row fields every training row must carry."""
    mode = cfg.data.demonstrations
    field = SAMPLE_SOURCES.spec(mode).peer_field
    if field is not None:
        name = getattr(cfg.task, field)
        lacking = sum(not isinstance(r.get(name), list) for r in rows)
        if lacking:
            raise ConfigError(f"task.{field}={name!r}: {lacking} task rows lack that field "
                              f"as a list of {{'text': ..., 'logprob': ...}} (they have: {', '.join(sorted(rows[0]))})")
    elif SAMPLE_SOURCES.spec(mode).template or (cfg.batches.source == "demonstrations" and cfg.task.demonstration):
        script = cfg.task.demonstration if isinstance(cfg.task.demonstration, list) else [cfg.task.demonstration]
        missing = sorted({n for t in script for n in template_fields(t) if any(n not in r for r in rows)})
        if missing:
            raise ConfigError(f"task.demonstration={cfg.task.demonstration!r} reads the row fields {missing}, which "
                              f"some task rows lack (they have: {', '.join(sorted(rows[0]))})")


def _source_rows(cfg: Config, rows: list[dict]) -> None:
    """The row fields a sample source's knobs name (hints, a guidance template) are in every training row."""
    knobs = source_params(cfg)
    for name in sorted(knobs.row_fields() if knobs is not None else ()):
        lacking = sum(name not in r for r in rows)
        if lacking:
            raise ConfigError(f"data.demonstrations={cfg.data.demonstrations} reads the task field {name!r}, which "
                              f"{lacking} of {len(rows)} training rows lack (they have: {', '.join(sorted(rows[0]))})")


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
            raise ConfigError(f"{readers[name]} reads the row field {name!r}, which only the rollouts of {setting} "
                              f"carry; set {setting}{hint}")
        if lacking:
            raise ConfigError(f"{readers[name]} reads the task field {name!r}, which {lacking} of {len(rows)} "
                              "training rows lack")


def streaming_problems(cfg: Config) -> list[str]:
    """Why this config's batches cannot be consumed chunk by chunk (empty: they can). Read from the
    methods' declarations: the estimator's `group_local`, the aggregation's `denominator`, the loss's
    `batch_statistics`, their states."""
    a, t = cfg.algo, cfg.trainer
    advantage, loss = ADVANTAGES.spec(a.advantage), LOSSES.spec(a.loss)
    checks = [
        (not advantage.group_local, f"algo.advantage={a.advantage} does not declare group_local=True: its "
                                    "advantages may read statistics of the whole batch"),
        (a.group_by is not None, "algo.group_by pools advantage groups across prompts, which chunks split"),
        *((SHAPERS.spec(s.name).whole_batch, f"the {s.name!r} shaper (algo.shaping) reads the whole batch")
          for s in active_shapers(a)),
        (loss.reads_whole_batch(a.loss_params),
         f"algo.loss={a.loss} with algo.loss_params={a.loss_params} reads a statistic of the whole batch, "
         "which each chunk would compute apart"),
        (advantage.state is not None or loss.state is not None,
         f"algo.advantage={a.advantage} / algo.loss={a.loss} keep a state that learns from the whole batch"),
        (AGGREGATIONS.spec(a.aggregation).denominator is None,
         f"algo.aggregation={a.aggregation} declares no single denominator to divide the summed gradients by"),
        *((TERMS.spec(t.name).denominator != "aggregation",
           f"the {t.name!r} term ({KEYED_TERMS.get(t.name, 'algo.terms')}) has a denominator of its own")
          for t in active_terms(a)),
        (t.epochs * t.mini_batches > 1, "trainer.epochs and trainer.mini_batches must be 1: the update is one "
                                        "optimiser step on the whole batch"),
        (cfg.data.group_filter != "none", f"data.group_filter={cfg.data.group_filter} re-rolls prompts until "
                                          "enough groups pass: chunks could not be handed over before that"),
        (SAMPLE_SOURCES.spec(cfg.data.demonstrations).adds,
         f"data.demonstrations={cfg.data.demonstrations} adds samples to the "
                                            "assembled batch"),
    ]
    return [why for bad, why in checks if bad]


def _streaming(cfg: Config) -> None:
    """Refuse `rollout.stream_chunks` > 1 where chunk-by-chunk updates would not be the whole-batch update."""
    problems = streaming_problems(cfg) if cfg.rollout.stream_chunks > 1 else []
    if problems:
        raise ConfigError(f"rollout.stream_chunks={cfg.rollout.stream_chunks} trains on each chunk as it arrives, "
                          "which gives the whole-batch update only for a group-local preparation and one optimiser "
                          "step per batch; here:\n  " + "\n  ".join(problems))


CONFIG_STAGES = ("names", "combinations")  # need no data: build_config runs them
PIPELINE: list[tuple[str, Callable[..., None]]] = [
    ("names", _registered), ("names", _params), ("names", _reward_names), ("names", _trackers),
    ("combinations", _env_reward), ("combinations", _rollout_workers), ("combinations", _preset_clip_bounds), ("combinations", _preset_aggregation), ("combinations", _sequence_ratio),
    ("combinations", _kl_in_reward), ("combinations", _stop_rules), ("combinations", check_batches), ("combinations", _groups), ("combinations", _declared_checks),
    ("combinations", _peers), ("combinations", _demonstrations), ("combinations", _sample_source),
    ("combinations", _critic), ("combinations", _inputs), ("combinations", _rejected_tokens), ("combinations", _sampler_probe),
    ("combinations", _streaming), ("combinations", check_controller),
    ("data", _demonstration_rows), ("data", _source_rows), ("data", _method_rows),
]


def check_refresh(reward_model, policy, refresh) -> None:
    """A refresh pipeline's two stages (docs/pipelines.md#refresh): the reward model learns from labelled
    rollouts, and the policy stage records its rollouts, evaluates and keeps a checkpoint at each evaluation
    (what a rollback returns to), samples in step (the rollouts after a checkpoint come from its weights), stops
    on a `drop` rule of its evaluation, and reads the reward model (a `{from: <label>}` in its settings)."""
    rm, cfg, where = reward_model.config, policy.config, f"refresh: the policy stage {policy.label!r}"
    if rm.batches.source != "rollout_pairs":
        raise ConfigError(f"refresh: the reward-model stage {reward_model.label!r} trains on labelled rollouts: "
                          f"batches.source=rollout_pairs (it has {rm.batches.source})")
    rank_by = rm.batches.params.get("rank_by")
    if rank_by != cfg.reward.accuracy_component:
        raise ConfigError(f"refresh: the reward-model stage {reward_model.label!r} must rank its pairs by the gold "
                          f"component the policy stage grades with: batches.params.rank_by="
                          f"{cfg.reward.accuracy_component} (it has {rank_by}); ranked by the proxy's own reward "
                          "it would learn the proxy")
    if reward_model.round == 1 and not str(rm.batches.dataset or "").endswith(".jsonl"):
        raise ConfigError(f"refresh: the first reward model's data is a run's rollouts.jsonl, which the feedback "
                          f"extends line by line (batches.dataset={rm.batches.dataset})")
    if refresh.feedback_groups > cfg.rollout.prompts_per_step:
        raise ConfigError(f"refresh.feedback_groups={refresh.feedback_groups}: the fresh labels are the groups of "
                          f"one step, rollout.prompts_per_step={cfg.rollout.prompts_per_step} of them")
    if not BATCH_SOURCES.spec(cfg.batches.source).policy_gradient:
        raise ConfigError(f"{where} trains on its rollouts: batches.source=rollouts (it has {cfg.batches.source})")
    drops = [rule for rule in cfg.trainer.stop_when if rule.drop is not None and rule.at_evaluation]
    if len(drops) != 1:
        raise ConfigError(f"{where} needs one trainer.stop_when rule with `drop` on a metric of the evaluation "
                          "(e.g. {metric: eval/accuracy, drop: 0.03, while_rising: eval/reward/reward_model}): "
                          "it says when the policy over-optimises the proxy")
    run = cfg.run
    if not run.save_rollouts:
        raise ConfigError(f"{where}: set run.save_rollouts=true (the next round's reward model learns from them)")
    if cfg.rollout.max_staleness is not None:
        raise ConfigError(f"{where}: rollout.max_staleness must be unset (the rollouts after a checkpoint must "
                          "come from its weights)")
    if not run.checkpoint_every or cfg.eval.every % run.checkpoint_every:
        raise ConfigError(f"{where}: run.checkpoint_every must divide eval.every={cfg.eval.every} (a rollback "
                          "goes back to an evaluated checkpoint)")
    if run.keep_checkpoints * run.checkpoint_every < cfg.trainer.steps:
        raise ConfigError(f"{where}: run.keep_checkpoints must keep every checkpoint (at least "
                          f"{-(-cfg.trainer.steps // run.checkpoint_every)}): a rollback may go back to any of them")
    if not any(ref["from"] == reward_model.label for ref in references(policy.tree)):
        raise ConfigError(f"{where} never reads the reward model: give its reward component the path "
                          f"{{from: {reward_model.label.rsplit('-', 1)[0]}}}")


def run_stages(stages: tuple[str, ...], *args: Any) -> None:
    """Run the pipeline's checks of `stages` in order; the first failure raises ConfigError."""
    for stage, check in PIPELINE:
        if stage in stages:
            check(*args)


def check_names(cfg: Config) -> None:
    """The stages that need no data: names resolve, then declarations and settings fit together."""
    run_stages(CONFIG_STAGES, cfg)


def check_row_fields(cfg: Config, rows: list[dict]) -> None:
    """The data stage, once the training rows are loaded."""
    run_stages(("data",), cfg, rows)
