"""Loading a config: recipe YAML files (which may inherit with `base:`), old key spellings, dotted overrides,
the preset, then the validation stages that need no data (lmrl.validation), so that an impossible
combination fails here, before any model loads. Every config a run uses comes through `build_config`.
"""
from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lmrl.config import RESUMABLE, AlgoConfig, Config, RunConfig, resumable
from lmrl.pipeline_config import FEEDBACK_FILE, PipelineConfig, PipelineStage, RefreshConfig, StageEntry
from lmrl.errors import ConfigError
from lmrl.presets import PRESETS
from lmrl.recipe_files import (apply_override, check_keys, get_dotted, has_dotted, is_reference, list_note,
                               merge_trees, migrate_keys, parse_override, read_yaml, recipe_tree, resolve_references,
                               seed_named_list, set_dotted)


def load_config(recipe: str | None = "quickstart", overrides: list[str] | None = None) -> Config:
    """Load a recipe (with its bases), apply dotted overrides, expand the preset, and validate everything.

    An override may enter a list of named entries by name (`reward.components.answer.weight=0.5`, or an
    entry the preset brings: `algo.terms.demo_nll.coef=0.2`); one that replaces a list the recipe set, and
    a key spelled as an earlier version did, are recorded in `cfg.notes`. A pipeline recipe (one with
    `stages:`) is `load_recipe`'s."""
    tree = recipe_tree(recipe)
    if "stages" in tree:
        raise ConfigError(f"{recipe} is a pipeline recipe (it has stages:): train it with `lmrl train {recipe}` "
                          "(from Python: lmrl.loading.load_recipe), or name the recipe of one of its stages")
    return config_from_tree(tree, [parse_override(item) for item in overrides or []])


def load_recipe(recipe: str | None = "quickstart", overrides: list[str] | None = None) -> Config | PipelineConfig:
    """`load_config`, or for a recipe with `stages:` its pipeline, every stage validated (`pipeline_from_tree`)."""
    tree = recipe_tree(recipe)
    parsed = [parse_override(item) for item in overrides or []]
    return pipeline_from_tree(tree, parsed) if "stages" in tree else config_from_tree(tree, parsed)


def config_from_tree(tree: dict[str, Any], parsed: list[tuple[str, Any]]) -> Config:
    """A recipe's tree with parsed overrides applied (the run's preset seeding the lists they enter), validated."""
    tree, notes = _overridden(tree, parsed)
    cfg = build_config(tree)
    cfg._notes = tuple(note for note in [*notes, *cfg.notes] if note)
    return cfg


def _overridden(tree: dict[str, Any], parsed: list[tuple[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """A copy of `tree` with old key spellings rewritten and `parsed` applied; the notes that made."""
    tree = copy.deepcopy(tree)
    preset = next((value for key, value in reversed(parsed) if key == "algo.preset"),
                  (tree.get("algo") or {}).get("preset", AlgoConfig.model_fields["preset"].default))
    settings = _preset_settings({"algo": {"preset": preset}})  # the run's preset, wherever it is set
    notes = migrate_keys(tree, settings)
    for key, value in parsed:
        seed_named_list(tree, key, Config, settings)
        notes.append(apply_override(tree, key, value))
    return tree, notes


def dotted_items(mapping: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A nested mapping as (dotted key, value) pairs: `{trainer: {steps: 3}}` is `trainer.steps=3`, so a
    stage's mapping merges key by key. A stage reference (`{from: <label>}`) is a value, not a section."""
    items = []
    for key, value in mapping.items():
        if isinstance(value, dict) and value and not is_reference(value):
            items += dotted_items(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def _stage_entries(tree: dict[str, Any]) -> list[StageEntry]:
    entries = tree.get("stages")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"stages: a list of stages, each {{name: <label>, recipe: ..., overrides: {{...}}}} "
                          f"(got {entries!r})")
    found = []
    for i, entry in enumerate(entries):
        try:
            found.append(StageEntry.model_validate(entry))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"stages[{i}]{'.' + where if where else ''}: {first['msg']}") from None
    labels = [entry.name for entry in found]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(f"stages: the label {repeated[0]!r} is used twice; each stage needs its own label")
    return found


def _label_of(key: str, labels: list[str]) -> str:
    """The stage label a `stages.<label>.key` override names, or an error naming the nearest label."""
    label = key.split(".")[1] if key.count(".") >= 1 else ""
    if label in labels:
        return label
    near = difflib.get_close_matches(label, labels, n=1, cutoff=0.4)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ConfigError(f"{key}: the pipeline has no stage {label!r}; {hint}its stages: {', '.join(labels)}")


def _split_overrides(parsed: list[tuple[str, Any]], labels: list[str]) -> tuple[list, dict[str, list]]:
    """(the overrides of every stage, label -> the `stages.<label>.key=value` ones of that stage)."""
    shared, own = [], {label: [] for label in labels}
    for key, value in parsed:
        if key != "stages" and not key.startswith("stages."):
            shared.append((key, value))
            continue
        label = _label_of(key, labels)
        rest = key.split(".", 2)[2] if key.count(".") >= 2 else ""
        if not rest and not isinstance(value, dict):
            raise ConfigError(f"{key}: name a key of the stage, e.g. stages.{label}.trainer.steps=5")
        own[label] += dotted_items(value) if not rest else [(rest, value)]
    return shared, own


def _model_source(label: str, value: Any, earlier: list[str]) -> str:
    """The earlier stage `model.path: {from: <label>}` names."""
    source = value.get("from")
    if source in earlier:
        return source
    near = difflib.get_close_matches(str(source), earlier, n=1, cutoff=0.4)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"stage {label!r}: model.path: {{from: {source}}} must name an earlier stage "
                      f"({', '.join(earlier) or 'none: it is the first'}){hint}")


def _rounds(entries: list[StageEntry], refresh: RefreshConfig | None) -> list[tuple[StageEntry, str, str | None, int]]:
    """(entry, its label in the recipe, refresh role, round) of each stage the pipeline trains: its entries, or
    with `refresh:` its two stages once per round, labelled `<label>-<round>`."""
    if refresh is None:
        return [(entry, entry.name, None, 0) for entry in entries]
    if len(entries) != 2:
        raise ConfigError(f"refresh: a pipeline of two stages, the reward model then the policy trained against it "
                          f"(this one has {len(entries)})")
    return [(entry.model_copy(update={"name": f"{entry.name}-{r}"}), entry.name, role, r)
            for r in range(1, refresh.rounds + 1) for entry, role in zip(entries, ("reward_model", "policy"))]


def _refresh_settings(role: str | None, r: int, names: list[str], stages: list[PipelineStage]) -> list[tuple[str, Any]]:
    """What a refresh round sets on its stage: after the first round the reward model starts again from the first
    one's model, on the data the previous policy stage left (`FEEDBACK_FILE`), and the policy goes on from the
    previous policy stage's rolled-back weights."""
    if r < 2:
        return []
    reward_model, policy = names
    if role == "reward_model":
        return [("model.path", stages[0].config.model.path),
                ("batches.dataset", {"from": f"{policy}-{r - 1}", "file": FEEDBACK_FILE})]
    return [("model.path", {"from": f"{policy}-{r - 1}"})]


def _renamed(tree: Any, names: dict[str, str]) -> Any:
    """`tree` with the stage references of a refresh round's stages pointing at that round's stages."""
    return resolve_references(tree, lambda label, file: {"from": names.get(label, label),
                                                         **({"file": file} if file else {})})


def checked_tree(label: str, tree: dict[str, Any], earlier: list[PipelineStage]) -> dict[str, Any]:
    """A stage's tree as it is validated before any stage ran: each reference to an earlier stage's weights is
    the model that stage starts from, a reference to a file is named as such; a reference to a stage that is not
    earlier is an error naming the nearest one."""
    known = {stage.label: stage for stage in earlier}

    def path_of(source: str, file: str | None) -> str:
        if source not in known:
            near = difflib.get_close_matches(str(source), list(known), n=1, cutoff=0.4)
            raise ConfigError(f"stage {label!r}: {{from: {source}}} must name an earlier stage "
                              f"({', '.join(known) or 'none: it is the first'})"
                              + (f"; did you mean {near[0]!r}?" if near else ""))
        return known[source].config.model.path if file is None else f"<stage {source}>/{file}"

    return resolve_references(tree, path_of)


def pipeline_from_tree(tree: dict[str, Any], parsed: list[tuple[str, Any]]) -> PipelineConfig:
    """A pipeline recipe's stages, each a validated Config (docs/pipelines.md, "Precedence").

    A stage's tree is, lowest first: its `recipe` (with its bases), the pipeline's top-level keys, its
    `overrides`, the command line's overrides, then the command line's `stages.<label>.key=value`. A stage
    after the first starts from the final weights of the stage before it, unless its own overrides set
    `model.path` (a path, or `{from: <label>}` for an earlier stage; a `model.path` among the shared keys or
    the command line's overrides is the first stage's model); its config is validated with the model that
    chain starts from, and the run puts the earlier stage's exported weights there. Any other value may be
    `{from: <label>}` (an earlier stage's final weights, e.g. a reward model's path) or `{from: <label>, file:
    <name>}` (a file in its folder). With `refresh:`, the two stages repeat once per round (`_rounds`)."""
    entries = _stage_entries(tree)
    labels = [entry.name for entry in entries]
    refresh = RefreshConfig.model_validate(tree["refresh"]) if tree.get("refresh") is not None else None
    shared_tree = {key: value for key, value in tree.items()
                   if key not in ("stages", "recipe", "description", "refresh")}
    shared, own = _split_overrides(parsed, labels)
    rounds = _rounds(entries, refresh)
    stages: list[PipelineStage] = []
    for entry, name, role, r in rounds:
        base = recipe_tree(entry.recipe) if entry.recipe else {}
        stage_tree = merge_trees(base, copy.deepcopy(shared_tree))
        stage_tree["recipe"] = base.get("recipe", tree.get("recipe"))
        stage_tree["description"] = base.get("description", tree.get("description", ""))
        refreshed = _refresh_settings(role, r, labels, stages)
        sets_path = any(key == "model.path" for key, _ in [*dotted_items(entry.overrides), *own[name], *refreshed])
        every = [(key, value) for key, value in shared if not (sets_path and key == "model.path")]
        try:
            stage_tree, notes = _overridden(stage_tree, [*dotted_items(entry.overrides), *every, *own[name],
                                                         *refreshed])
            if role is not None:
                stage_tree = _renamed(stage_tree, {label: f"{label}-{r}" for label in labels})
            path = get_dotted(stage_tree, "model.path")
            chained = stages and not sets_path and role is None
            model_from = _model_source(entry.name, path, [s.label for s in stages]) if isinstance(path, dict) \
                else stages[-1].label if chained else None
            if model_from is not None:
                set_dotted(stage_tree, "model.path", next(s for s in stages if s.label == model_from).config.model.path)
            cfg = build_config(checked_tree(entry.name, stage_tree, stages))
        except ConfigError as err:
            raise ConfigError(f"stage {entry.name!r} ({len(stages) + 1} of {len(rounds)}): {err}") from None
        cfg._notes = tuple(note for note in [*notes, *cfg.notes] if note)
        stages.append(PipelineStage(entry.name, cfg, stage_tree, model_from, role, r))
    if refresh is not None:
        from lmrl.validation import check_refresh  # the checks read the registries, which import torch

        check_refresh(stages[0], stages[1], refresh)
    run_tree = copy.deepcopy(shared_tree.get("run") or {})
    for key, value in shared:
        if key.startswith("run."):
            set_dotted(run_tree, key.removeprefix("run."), value)
    return PipelineConfig(tree.get("recipe"), tree.get("description", ""), RunConfig.model_validate(run_tree),
                          tuple(stages), refresh)


def _preset_settings(tree: dict[str, Any]) -> dict[str, Any]:
    name = str((tree.get("algo") or {}).get("preset", AlgoConfig.model_fields["preset"].default))
    if name not in PRESETS:
        raise ConfigError(f"algo.preset: {PRESETS.unknown_message(name)}")
    return PRESETS.get(name).settings


def _expand_preset(tree: dict[str, Any]) -> tuple[frozenset[str], list[str]]:
    """Fill the preset's settings the user left unset: the dotted keys it filled, and a note per list of the
    preset that the user's own list replaced."""
    settings = _preset_settings(tree)
    filled = [key for key in settings if not has_dotted(tree, key)]
    for key in filled:
        set_dotted(tree, key, copy.deepcopy(settings[key]))
    notes = [list_note(key, settings[key], tree, f"the preset {tree['algo']['preset']}'s")
             for key in settings if key not in filled and _names(settings[key]) - _names(get_dotted(tree, key))]
    return frozenset(filled), [note for note in notes if note]


def _names(items: Any) -> set[str]:
    """The names of a list of named entries (empty for anything else)."""
    return {item["name"] for item in items if isinstance(item, dict) and "name" in item} \
        if isinstance(items, list) else set()


def build_config(tree: dict[str, Any]) -> Config:
    """A validated Config from a tree: old key spellings rewritten, known keys, the preset expanded, field
    types, then the validation stages that need no data (names resolve, method declarations fit the settings)."""
    tree = copy.deepcopy(tree)
    notes = migrate_keys(tree, _preset_settings(tree))
    check_keys(tree, Config)
    filled, replaced = _expand_preset(tree)
    try:
        cfg = Config.model_validate(tree)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            lines.append(f"{loc or 'config'}: {e['msg']}" + (f" (got {e['input']!r})" if loc else ""))
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None
    cfg._preset_filled = filled
    cfg._notes = tuple(notes + replaced)
    from lmrl.validation import check_names  # the checks read the registries, which import torch

    check_names(cfg)
    for name in cfg.roles:
        role_config(cfg, name)  # each role's own objective and reward are validated as a run's
    return cfg


# what a role's own config keeps of the run's: what it samples and learns with comes from its `roles:` entry
ROLE_KEEPS = ("model", "task", "rollout", "trainer", "run")


def role_config(cfg: Config, name: str) -> Config:
    """The config role `name` learns by: the run's model, rollout and trainer settings with the role's `trainer`
    keys over them, its own `reward`, its `algo` (the run's when it sets none; a preset it names is expanded as
    a run's), its `lora`, temperature and reply length; validated as a run's (errors name the role)."""
    role = cfg.roles[name]
    run = cfg.model_dump(mode="json")
    tree = {key: run[key] for key in ROLE_KEEPS}
    tree["trainer"] = merge_trees(tree["trainer"], dict(role.trainer))
    tree["trainer"].update({"stop_when": [],  # its phases are its own, not the policy's
                            "train_steps": role.trainer.get("train_steps"),
                            "train_cycle": role.trainer.get("train_cycle")})
    if role.reward is not None:
        tree["reward"] = role.reward.model_dump(mode="json")
    tree["algo"] = dict(role.algo) if role.algo else run["algo"]
    tree["rollout"].update({"temperature": role.temperature, "max_new_tokens": role.max_new_tokens,
                            "max_staleness": None, "controller": None, "controller_params": {}})
    if role.model not in ("adapter", "policy"):
        tree["model"] = {"path": role.model, "lora": None}
    if role.lora is not None:
        tree["model"]["lora"] = role.lora.model_dump(mode="json")
    try:
        return build_config(tree)
    except ConfigError as err:
        raise ConfigError(f"roles.{name}: {err}") from None


def load_run_config(run_dir: Path, overrides: list[str] | None = None) -> Config:
    """The config a run was started with (`run_dir/config.yaml`), with the overrides that are safe mid-run."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there, so it is not an lmrl run directory")
    tree = read_yaml(path)
    for item in overrides or []:
        key, value = parse_override(item)
        if not resumable(key):
            raise ConfigError(f"{key} cannot change when resuming {run_dir}: the run would continue under other "
                              f"settings than it started with. Settings that may change: "
                              f"{', '.join(k + '*' if k.endswith('.') else k for k in RESUMABLE)}. "
                              f"Start a new run to change {key}")
        set_dotted(tree, key, value)
    return build_config(tree)
