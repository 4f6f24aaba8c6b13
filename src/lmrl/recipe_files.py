"""Reading recipe files: YAML with a one-line error per syntax problem, `base:` inheritance chains,
dotted `key=value` overrides (a list of named entries is entered by name: `reward.components.answer.weight=0.5`).
`lmrl.config` turns the resulting tree into a validated `Config`.
"""
from __future__ import annotations

import copy
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from lmrl.errors import ConfigError

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
SHIPPED_DATA = RECIPES_DIR / "data"  # small datasets the recipes train on, read by name


def _named(items: list, name: str, key: str) -> dict:
    """The element of a list of named entries (`reward.components`) whose `name` is `name`."""
    names = [item.get("name") for item in items if isinstance(item, dict)]
    for item in items:
        if isinstance(item, dict) and item.get("name") == name:
            return item
    near = difflib.get_close_matches(name, [str(n) for n in names], n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ConfigError(f"{key}: the list has no entry named {name!r}; {hint}it has: "
                      f"{', '.join(map(str, names)) or 'none'} (to add one, give the whole list)")


def set_dotted(tree: dict, key: str, value: Any) -> None:
    """Set `a.b.c` in `tree`. A part that meets a list of named entries selects the entry by its `name`:
    `reward.components.answer.weight=0.5` changes that component and keeps the others as they are."""
    parts = key.split(".")
    node: Any = tree
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = _named(node, part, ".".join(parts[:i]))
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"{key}: {part!r} is not a section")
    if isinstance(node, list):
        raise ConfigError(f"{key}: {parts[-2]!r} is a list of named entries; set a field of one of them, e.g. "
                          f"{key}.weight=0.5, or give the whole list as {'.'.join(parts[:-1])}=[...]")
    node[parts[-1]] = value


_MISSING = object()


def get_dotted(tree: dict, key: str, missing: Any = None) -> Any:
    """The value at a dotted key of a nested dict, or `missing` when a part of the path is absent."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return missing
        node = node[part]
    return node


def has_dotted(tree: dict, key: str) -> bool:
    return get_dotted(tree, key, _MISSING) is not _MISSING


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()


def _entry(item: Any) -> str:
    """A list entry in one short phrase: `answer{fallback: last_number}`, `format(weight: 0.5)`."""
    if not isinstance(item, dict) or "name" not in item:
        return _flow(item)
    rest = {k: v for k, v in item.items() if k not in ("name", "params")}
    params = _flow(item["params"]) if item.get("params") else ""
    return f"{item['name']}{params}" + (f"({_flow(rest)[1:-1]})" if rest else "")


def list_note(key: str, before: Any, tree: dict, whose: str = "the recipe's") -> str | None:
    """What replacing the list `before` by the one now at `key` in `tree` took away, in one line; None
    when nothing was replaced (entries not repeated in the new list lose their settings, so the run says so)."""
    value = get_dotted(tree, key)
    if not isinstance(before, list) or before == value:
        return None
    note = (f"{key}: replaced {whose} list [{', '.join(map(_entry, before))}] with "
            f"[{', '.join(map(_entry, value)) if isinstance(value, list) else _entry(value)}]")
    kept = [item["name"] for item in before if isinstance(item, dict) and "name" in item]
    if kept:
        note += f" (to change one entry and keep the others, name it: {key}.{kept[0]}.<field>=…)"
    return note


def apply_override(tree: dict, key: str, value: Any) -> str | None:
    """Set one dotted override; returns `list_note` when it swaps a list the recipe set for another."""
    before = get_dotted(tree, key)
    set_dotted(tree, key, value)
    note = list_note(key, before, tree)
    return note.replace(": replaced", ": override replaced", 1) if note else None


def _section_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the section model a field holds, whether it holds a list of them): `X`, `X | None`, `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    args = typing.get_args(annotation)
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    if typing.get_origin(annotation) is list and models:
        return models[0], True
    return (models[0], False) if models and type(None) in args else (None, False)


def _all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the schema, sections' fields included."""
    keys = []
    for name, info in model.model_fields.items():
        keys.append(prefix + name)
        section, _ = _section_of(info.annotation)
        if section is not None:
            keys += _all_keys(section, f"{prefix}{name}.")
    return keys


def _unknown_key_hint(key: str, value: Any, model: type[BaseModel], prefix: str, schema: type[BaseModel]) -> str:
    """The nearest valid key: a field of this section, a field named like a leaf under an unknown
    section (`trainer.optim.lrr` → `trainer.lr`), or the same name in another section."""
    fields = list(model.model_fields)
    leaves = list(value) if isinstance(value, dict) else []
    near = difflib.get_close_matches(key, fields, n=1, cutoff=0.5)
    for leaf in [] if near else leaves:
        near = difflib.get_close_matches(leaf, fields, n=1, cutoff=0.6)
        if near:
            break
    if near:
        return f"; did you mean '{prefix}{near[0]}'?"
    elsewhere = [k for k in _all_keys(schema) if "." in k and k.rsplit(".", 1)[-1] in (key, *leaves)]
    return f"; did you mean '{elsewhere[0]}'?" if elsewhere else f"; valid keys: {', '.join(fields)}"


def check_keys(tree: dict, schema: type[BaseModel], model: type[BaseModel] | None = None, prefix: str = "") -> None:
    """Reject unknown keys of `schema` (in sections and in lists of entries), naming the nearest valid one."""
    model = model or schema
    for key, value in tree.items():
        fields = model.model_fields
        if key not in fields:
            hint = _unknown_key_hint(key, value, model, prefix, schema)
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
        section, is_list = _section_of(fields[key].annotation)
        if section is not None and not is_list and isinstance(value, dict):
            check_keys(value, schema, section, f"{prefix}{key}.")
        for i, item in enumerate(value if section is not None and is_list and isinstance(value, list) else []):
            if isinstance(item, dict):
                check_keys(item, schema, section, f"{prefix}{key}[{i}].")


def seed_named_list(tree: dict, key: str, schema: type[BaseModel], defaults: dict[str, Any] | None = None) -> None:
    """Before `reward.components.answer.weight=…` where the recipe leaves the list unset: the list from
    `defaults` (dotted key -> value, e.g. the preset's settings) when it has one, else the field's default."""
    node: Any = tree
    model: type[BaseModel] | None = schema
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        info = model.model_fields.get(part) if model is not None and isinstance(node, dict) else None
        if info is None:
            return
        section, is_list = _section_of(info.annotation)
        if is_list and part not in node:
            dotted = ".".join(parts[: i + 1])
            if defaults and dotted in defaults:
                node[part] = copy.deepcopy(defaults[dotted])
            else:
                default = info.get_default(call_default_factory=True)
                node[part] = [item.model_dump(exclude_defaults=True) for item in default]
            return
        node, model = node.setdefault(part, {}), section


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


def recipe_tree(name: str | None) -> dict[str, Any]:
    """The tree of the recipe `name` (shipped, or a YAML path) with its bases, its `recipe` key set to the
    file's stem; empty for None (the defaults)."""
    if not name:
        return {}
    path = recipe_path(name)
    tree = read_recipe(path)
    tree.setdefault("recipe", path.stem)
    return tree


def _into(items: list, entry: dict) -> None:
    """Add `entry` to a list of named entries, or update the entry of that name (its params merged)."""
    for item in items:
        if isinstance(item, dict) and item.get("name") == entry["name"]:
            params = {**item.get("params", {}), **entry.get("params", {})}
            item.update({**entry, **({"params": params} if params else {})})
            return
    items.append(entry)


def _drop(items: list, name: str) -> None:
    items[:] = [item for item in items if not (isinstance(item, dict) and item.get("name") == name)]


def _demo_nll(algo: dict) -> dict | None:
    coef = algo.pop("demo_nll_coef")
    return {"name": "demo_nll", "coef": coef} if coef else None


def _overlong(algo: dict) -> dict | None:
    buffer, factor = algo.pop("overlong_buffer", 0), algo.pop("overlong_factor", 1.0)
    return {"name": "overlong", "params": {"buffer": buffer, "factor": factor}} if buffer else None


def _cost_aware(algo: dict) -> dict | None:
    fraction = algo.pop("cost_aware_fraction")
    return {"name": "cost_aware", "params": {"fraction": fraction}} if fraction else None


def _distill(algo: dict) -> dict | None:
    section = algo.pop("distill")
    renamed = {"params": "context_params"}
    params = {renamed.get(k, k): v for k, v in section.items() if k != "coef"}
    entry = {"name": "distill", "coef": section.get("coef", 0.0), **({"params": params} if params else {})}
    return entry if entry["coef"] else None


# Keys of earlier versions that were one method's fields of `algo`: (the old keys, the list whose entry
# they are now, the entry's name, what makes the entry from them: None when their values switch it off)
_OLD_ALGO_KEYS = [(("demo_nll_coef",), "terms", "demo_nll", _demo_nll),
                  (("distill",), "terms", "distill", _distill),
                  (("overlong_buffer", "overlong_factor"), "shaping", "overlong", _overlong),
                  (("cost_aware_fraction",), "shaping", "cost_aware", _cost_aware)]
_RENAMED_ALGO_LISTS = {"extra_terms": "terms", "extra_shapers": "shaping"}


def migrate_keys(tree: dict, defaults: dict[str, Any] | None = None) -> list[str]:
    """Rewrite, in place, the `algo` keys earlier versions spelled otherwise; returns one note per old key
    that had an effect, giving the new spelling.

    One method's fields became entries of `algo.terms` and `algo.shaping` (`algo.demo_nll_coef: 0.1` is
    `algo.terms: [{name: demo_nll, coef: 0.1}]`; `algo.distill: {coef, context, params, tokens, estimator}`
    a `distill` entry whose params are `context`, `context_params`, `tokens` and `estimator`), and
    `algo.extra_terms` / `algo.extra_shapers` add to those lists. An old key meets the list as the user
    set it or, where the user did not, as `defaults` (the preset's settings) have it: it sets its entry
    there, or removes it when its value switches it off, and keeps the others."""
    algo = tree.get("algo")
    if not isinstance(algo, dict):
        return []
    defaults, notes = defaults or {}, []
    unset = {field for field in ("terms", "shaping") if field not in algo and f"algo.{field}" not in defaults}

    def entries(field: str) -> list:
        if field not in algo:
            algo[field] = copy.deepcopy(list(defaults.get(f"algo.{field}", [])))
        return algo[field]

    for keys, field, name, make in _OLD_ALGO_KEYS:
        if not any(key in algo for key in keys):
            continue
        entry = make(algo)
        if entry is None:
            _drop(entries(field), name)
            continue
        _into(entries(field), entry)
        notes.append(f"algo.{keys[0]} is spelled algo.{field}: {_flow([entry])} now (docs/migration.md)")
    for old, new in _RENAMED_ALGO_LISTS.items():
        added = algo.pop(old, None) or []
        for entry in added:
            _into(entries(new), entry)
        if added:
            notes.append(f"algo.{old} is spelled algo.{new} now (docs/migration.md)")
    for field in unset:
        if algo.get(field) == []:
            del algo[field]
    return notes


# Stage references of a pipeline (docs/pipelines.md) -------------------------------------------------

def is_reference(value: Any) -> bool:
    """`{from: <label>}` (an earlier stage's final weights) or `{from: <label>, file: <name>}` (a file it wrote)."""
    return isinstance(value, dict) and "from" in value and set(value) <= {"from", "file"}


def references(tree: Any) -> list[dict]:
    """Every stage reference in a stage's tree, lists included."""
    if is_reference(tree):
        return [tree]
    children = list(tree.values()) if isinstance(tree, dict) else tree if isinstance(tree, list) else []
    return [ref for child in children for ref in references(child)]


def resolve_references(tree: Any, path_of) -> Any:
    """A copy of `tree` with each stage reference replaced by `path_of(label, file)` (`model.path`'s included)."""
    if is_reference(tree):
        return path_of(tree["from"], tree.get("file"))
    if isinstance(tree, dict):
        return {key: resolve_references(value, path_of) for key, value in tree.items()}
    if isinstance(tree, list):
        return [resolve_references(value, path_of) for value in tree]
    return tree


def shipped_or_local(dataset: str) -> Path:
    """The dataset's path: a file or directory here, else the data file of that name shipped with the recipes
    (`src/lmrl/recipes/data/`, e.g. `arithmetic_steps.jsonl`), else the name as given (a hub id)."""
    path = Path(dataset).expanduser()
    shipped = SHIPPED_DATA / dataset
    return shipped if not path.exists() and path.name == dataset and shipped.is_file() else path
