"""Shipped recipes validate, and recipes inherit: `base:` chains, key-by-key merges, cycles refused."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lmrl.config import ConfigError
from lmrl.pipeline_config import PipelineConfig
from lmrl.loading import load_config, load_recipe
from lmrl.recipe_files import RECIPES_DIR, merge_trees, read_recipe, read_yaml, recipe_path
from lmrl.validation import check_names

SHIPPED = sorted(p.stem for p in Path(RECIPES_DIR).glob("*.yaml"))


@pytest.mark.parametrize("recipe", SHIPPED)
def test_every_shipped_recipe_loads_and_passes_the_config_stages(recipe):
    loaded = load_recipe(recipe)
    for cfg in [s.config for s in loaded.stages] if isinstance(loaded, PipelineConfig) else [loaded]:
        check_names(cfg)
        assert cfg.description
    assert loaded.description, f"recipe {recipe} needs a description"
    assert loaded.recipe == recipe


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _at(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree.get(part, {}) if isinstance(tree, dict) else {}
    return tree


@pytest.mark.parametrize("recipe", [r for r in SHIPPED if "base" in read_yaml(recipe_path(r))])
def test_a_shipped_recipe_keeps_only_what_differs_from_its_base(recipe):
    own = read_yaml(recipe_path(recipe))
    base = read_recipe(recipe_path(own.pop("base")))
    own.pop("description")
    repeated = [key for key, value in _leaves(own) if _at(base, key) == value]
    assert not repeated, f"{recipe} repeats its base's {repeated}"


def write(path: Path, tree: dict) -> Path:
    path.write_text(yaml.safe_dump(tree))
    return path


def test_merge_nested_dicts_key_by_key_lists_and_scalars_replace():
    base = {"task": {"params": {"a": 1, "b": 2}, "num_train": 5}, "reward": {"components": [{"name": "x"}]}}
    child = {"task": {"params": {"b": 3}}, "reward": {"components": [{"name": "y"}]}}
    assert merge_trees(base, child) == {"task": {"params": {"a": 1, "b": 3}, "num_train": 5},
                                        "reward": {"components": [{"name": "y"}]}}
    assert base["task"]["params"] == {"a": 1, "b": 2}  # the base is not modified


def test_recipes_inherit_recursively_with_their_own_description_and_name(tmp_path):
    write(tmp_path / "grand.yaml", {"base": "quickstart", "description": "grand", "recipe": "grand",
                                    "trainer": {"steps": 3}, "rollout": {"group_size": 4}})
    write(tmp_path / "parent.yaml", {"base": "grand.yaml", "description": "parent", "rollout": {"max_new_tokens": 9}})
    child = write(tmp_path / "child.yaml", {"base": "parent.yaml", "trainer": {"lr": 1e-4}})
    cfg = load_config(str(child))
    quick = load_config("quickstart")
    assert (cfg.recipe, cfg.description) == ("child", "")
    assert (cfg.trainer.steps, cfg.trainer.lr) == (3, 1e-4)
    assert (cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (4, 9)
    assert cfg.rollout.prompts_per_step == quick.rollout.prompts_per_step and cfg.task == quick.task


def test_an_inheritance_cycle_is_refused_naming_the_chain(tmp_path):
    write(tmp_path / "a.yaml", {"base": "b.yaml"})
    write(tmp_path / "b.yaml", {"base": "a.yaml"})
    with pytest.raises(ConfigError, match=r"recipe inheritance cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_config(str(tmp_path / "a.yaml"))
    write(tmp_path / "self.yaml", {"base": "self.yaml"})
    with pytest.raises(ConfigError, match=r"cycle: .*self\.yaml -> .*self\.yaml"):
        load_config(str(tmp_path / "self.yaml"))


def test_a_missing_or_malformed_base_names_the_recipe(tmp_path):
    child = write(tmp_path / "child.yaml", {"base": "quickstrt"})
    with pytest.raises(ConfigError, match=r"child\.yaml: base: no recipe 'quickstrt'; did you mean quickstart"):
        load_config(str(child))
    write(child, {"base": ["quickstart"]})
    with pytest.raises(ConfigError, match=r"child\.yaml: base must be a recipe name or path"):
        load_config(str(child))
