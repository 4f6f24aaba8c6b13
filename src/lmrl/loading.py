"""Loading a config: recipe YAML files (which may inherit with `base:`), old key spellings, dotted overrides,
the preset, then the validation stages that need no data (lmrl.validation), so that an impossible
combination fails here, before any model loads. Every config a run uses comes through `build_config`.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lmrl.config import RESUMABLE, AlgoConfig, Config, resumable
from lmrl.errors import ConfigError
from lmrl.presets import PRESETS
from lmrl.recipe_files import (apply_override, check_keys, get_dotted, has_dotted, list_note, migrate_keys,
                               parse_override, read_yaml, recipe_tree, seed_named_list, set_dotted)


def load_config(recipe: str | None = "quickstart", overrides: list[str] | None = None) -> Config:
    """Load a recipe (with its bases), apply dotted overrides, expand the preset, and validate everything.

    An override may enter a list of named entries by name (`reward.components.answer.weight=0.5`, or an
    entry the preset brings: `algo.terms.demo_nll.coef=0.2`); one that replaces a list the recipe set, and
    a key spelled as an earlier version did, are recorded in `cfg.notes`."""
    tree = recipe_tree(recipe)
    parsed = [parse_override(item) for item in overrides or []]
    preset = next((value for key, value in reversed(parsed) if key == "algo.preset"),
                  (tree.get("algo") or {}).get("preset", AlgoConfig.model_fields["preset"].default))
    settings = _preset_settings({"algo": {"preset": preset}})  # the run's preset, wherever it is set
    notes = migrate_keys(tree, settings)
    for key, value in parsed:
        seed_named_list(tree, key, Config, settings)
        notes.append(apply_override(tree, key, value))
    cfg = build_config(tree)
    cfg._notes = tuple(note for note in [*notes, *cfg.notes] if note)
    return cfg


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
    return cfg


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
