"""Reading recipe files: YAML with a one-line error per syntax problem, `base:` inheritance chains,
dotted `key=value` overrides. `lmrl.config` turns the resulting tree into a validated `Config`.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from lmrl.errors import ConfigError

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {part!r} is not a section")
    node[parts[-1]] = value


def _has_dotted(tree: dict, key: str) -> bool:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=value` → ("a.b", YAML-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. algo.loss=gspo)")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at column {len(key) + 2 + mark.column}" if mark else ""
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(err)}{where})") from None
    if isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads "2e-6" as a string
        except ValueError:
            pass
    return key.strip(), value


def _yaml_problem(err: yaml.YAMLError) -> str:
    return getattr(err, "problem", None) or str(err).splitlines()[0]


def read_yaml(path: Path) -> dict[str, Any]:
    """A recipe or run config as a mapping; a syntax error names the file, line and problem in one line."""
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {_yaml_problem(err)}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections")
    return loaded


def recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.exists():
        return path
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        raise ConfigError(f"recipe file {name_or_path} does not exist (current directory: {Path.cwd()})")
    candidate = RECIPES_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    near = difflib.get_close_matches(name_or_path, known, n=3)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise ConfigError(f"no recipe {name_or_path!r}{hint} (shipped: {', '.join(known)})")


def merge_trees(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """`child` over `base`: nested mappings merge key by key, lists and scalars replace."""
    out = dict(base)
    for key, value in child.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge_trees(out[key], value) if both else value
    return out


def _label(path: Path) -> str:
    return path.stem if path.parent == RECIPES_DIR else str(path)


def _base_path(base: object, child: Path) -> Path:
    """A bare name is a shipped recipe; a path is looked up beside the child first, then as given."""
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{child}: base must be a recipe name or path (got {base!r})")
    sibling = child.parent / base
    if sibling.is_file():
        return sibling.resolve()
    try:
        return recipe_path(base).resolve()
    except ConfigError as err:
        raise ConfigError(f"{child}: base: {err}") from None


def read_recipe(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe's tree with its `base:` chain merged under it (the child's description is its own)."""
    chain = (*chain, path.resolve())
    tree = read_yaml(path)
    if "base" not in tree:
        return tree
    parent = _base_path(tree.pop("base"), path)
    if parent in chain:
        cycle = " -> ".join(_label(p) for p in (*chain, parent))
        raise ConfigError(f"recipe inheritance cycle: {cycle}; a recipe's base may not lead back to it")
    inherited = read_recipe(parent, chain)
    inherited.pop("description", None)
    inherited.pop("recipe", None)
    return merge_trees(inherited, tree)
