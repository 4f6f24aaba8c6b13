"""The checks of demonstrations and sample sources: peer rollouts, templates and scripts of worked episodes, the
knobs of a sample source, and the row fields they read (stages "combinations" and "data")."""
from __future__ import annotations

from lmrl.algos import LOSSES
from lmrl.algos.terms import TERMS
from lmrl.config import Config, ConfigError
from lmrl.data.demonstrations import SAMPLE_SOURCES, source_params, template_fields
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_AGGREGATIONS


def _peers(cfg: Config) -> None:
    """Another policy's samples carry only a sequence log-prob, which only a sequence-level IS correction can use."""
    mode, field = cfg.data.demonstrations, SAMPLE_SOURCES.spec(cfg.data.demonstrations).peer_field
    if field is None:
        return
    if not getattr(cfg.task, field):
        raise ConfigError(f"data.demonstrations={mode} needs task.{field}, the task row field holding "                           "[{'text': ..., 'logprob': ...}, ...]")
    loss, knobs, spec = cfg.algo.loss, cfg.algo.loss_params, LOSSES.spec(cfg.algo.loss)
    if not spec.weighs_sequences(knobs):
        usable = [n for n, s in LOSSES.specs().items() if s.sequence_is]
        which = f"algo.loss={loss} with algo.loss_params={knobs}" if spec.sequence_is else f"algo.loss={loss}"
        raise ConfigError(f"data.demonstrations={mode} weighs another policy's completions by the sequence ratio "
                          f"π_self(y)/π_peer(y), but {which} does not use it (token ratios do not exist across "                           f"tokenizers); use algo.loss={' or '.join(usable) or '(none registered)'} with its "
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
        raise ConfigError(f"data.demonstrations={mode} scores each demonstration alone, but the reward components "                           f"{group} score whole groups; use per-sample components")
    if not REWARD_AGGREGATIONS.spec(cfg.reward.aggregation).per_sample:
        per_sample = sorted(n for n, agg in REWARD_AGGREGATIONS.specs().items() if agg.per_sample)
        raise ConfigError(f"data.demonstrations={mode} scores each demonstration alone, but "                           f"reward.aggregation={cfg.reward.aggregation} normalises within a group; use one of "                           f"{per_sample}")


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
        raise ConfigError(f"data.demonstrations={mode} rolls out extended prompts of a single-turn task; "                           f"env.name={cfg.env.name!r} runs episodes")
    if spec.generates and cfg.data.group_filter != "none":
        raise ConfigError(f"data.demonstrations={mode} looks at the groups the filter keeps, and "                           f"data.group_filter={cfg.data.group_filter} drops the hard ones first; set it to none")
    supervised = [t.name for t in cfg.algo.terms if TERMS.spec(t.name).weights == "demonstration" and t.coef != 0]
    if spec.supervised and not supervised:
        demo_terms = [n for n, term in TERMS.specs().items() if term.weights == "demonstration"]
        raise ConfigError(f"data.demonstrations={mode} adds rows that only a term over demonstration rows trains "
                          f"(λ_aux); add one to algo.terms, e.g. [{{name: {demo_terms[0]}, coef: 0.1}}]")


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
        raise ConfigError("batches.on_policy regenerates one completion per row, but the worked episodes of "                           f"env.name={cfg.env.name} are several turns; leave batches.on_policy unset")


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
