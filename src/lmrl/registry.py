"""One tiny generic registry used by every stage: implementations are chosen by name in the config.

Each entry is registered with one declaration of what it needs and guarantees: the registry's
`declares` record (a frozen dataclass, e.g. an estimator's inputs, state and group-relativity),
filled from the keyword arguments of `register` and read back with `spec(name)`. Checks, name
lists and the loop's behaviour are derived from these records, never from `if name == ...`.

A name of the form `path/to/file.py:attr` or `package.module:attr` is the user's own code: the file
(or module) is imported once, and `attr` is used from it. If the file registers `attr` itself (with
a registry's decorator), that registration decides where it belongs; an undecorated object is taken
by the registry that asked for it (`reward.components=[{name: my_rewards.py:short_and_right}]`,
`task.name=my_tasks.py:load`, `data.sampler=my_samplers.py:Curriculum`). Relative paths start at
the current directory; the file's own directory is put on `sys.path` so it can import its siblings.

`check_knobs` binds an entry's knobs (a reward's `params`, `data.sampler_params`, `algo.loss_params`…)
to its signature as its caller will call it, so a misspelt knob fails at config time with the nearest
valid name instead of raising on every call at run time. A catch-all named `**_` takes the arguments
a caller hands to every entry and ignores them: a knob only it would take is unknown.

Registering a taken name is refused unless it is the same object, or the same definition run again
(same module and qualified name: a notebook cell or a module executed a second time), which replaces it.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Collection, Generic, Iterator, TypeVar

T = TypeVar("T")

_ALL: list["Registry"] = []


class UserCodeError(ValueError):
    """User code named in the config (`file.py:attr`) that cannot be imported or lacks the name."""


class KnobError(ValueError):
    """Knobs that do not bind to a component's signature: unknown, passed by the caller, or missing."""


def is_user_code(name: object) -> bool:
    """`file.py:attr` or `package.module:attr`: a reference to the user's own code."""
    if not isinstance(name, str) or name.count(":") != 1 or any(c.isspace() for c in name):
        return False
    target, attr = name.split(":")
    return bool(target) and attr.isidentifier()


def _import_file(path: Path):
    module_name = f"lmrl_user_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}_{path.stem}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as err:
        del sys.modules[module_name]
        raise UserCodeError(f"{path}: importing it failed: {type(err).__name__}: {err}") from err
    return module


def load_user_object(spec: str) -> object:
    """The object `attr` of `file.py:attr` / `package.module:attr`, importing the file once per process."""
    target, attr = spec.split(":")
    if target.endswith(".py") or "/" in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise UserCodeError(f"{spec}: no file {path} (relative paths start at the current directory "
                                f"{Path.cwd()})")
        module = _import_file(path)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise UserCodeError(f"{spec}: cannot import module {target!r}: {err}") from err
    if not hasattr(module, attr):
        defined = sorted(n for n in vars(module) if not n.startswith("_"))
        near = difflib.get_close_matches(attr, defined, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else f"it defines: {', '.join(defined) or 'nothing'}"
        raise UserCodeError(f"{spec}: {target} has no {attr!r}; {hint}")
    return getattr(module, attr)


_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def check_knobs(target: Callable, knobs: dict[str, Any], owner: str, passed: int = 0, supplied: Collection[str] = (),
                consumed: Collection[str] = (), complete: bool = True) -> None:
    """Bind `knobs` to `target`'s signature as its caller calls it, or raise KnobError naming `owner`.

    The caller passes `passed` positional arguments first and the keywords `supplied` itself; `consumed`
    are knobs read by someone else (a method's state, an input lookup). `complete`: a parameter without
    a default that neither the caller nor the knobs fill is reported missing.
    """
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): it takes no knobs we can name
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:passed]
    rest = [p for p in params if p not in positional]
    takes_any = any(p.kind is p.VAR_KEYWORD and p.name != "_" for p in rest)
    taken_by_caller = {p.name for p in positional} | set(supplied)
    valid = [p.name for p in rest if p.kind in _NAMED and p.name not in taken_by_caller] + sorted(consumed)
    for key in knobs:
        if key in taken_by_caller:
            raise KnobError(f"{key!r} is passed by the run, not a param of {owner}")
        if key not in valid and not takes_any:
            near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise KnobError(f"unknown param {key!r} of {owner}{hint} (its params: {', '.join(valid) or 'none'})")
    missing = [p.name for p in rest if p.kind in _NAMED and p.default is p.empty
               and p.name not in knobs and p.name not in taken_by_caller]
    if complete and missing:
        raise KnobError(f"{owner} needs the param(s) {', '.join(map(repr, missing))}, which are not set")


def redefines(old: object, new: object) -> bool:
    """Whether registering `new` where `old` is may replace it: the same object again, or the same definition
    run again (same module and qualified name: a notebook cell, a module executed twice, or run as `python -m`). Lambdas, which
    share the qualified name `<lambda>`, are never taken for one another."""
    if new is old:
        return True
    qualname = getattr(new, "__qualname__", None)
    return (qualname is not None and "<lambda>" not in qualname
            and (_module_of(new), qualname) == (_module_of(old), getattr(old, "__qualname__", None)))


def _module_of(obj: object) -> str | None:
    """The module that defined `obj`, by its import name also when it runs as `python -m` (`__main__`)."""
    module = getattr(obj, "__module__", None)
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name if spec is not None else module
    return module


class Registry(Generic[T]):
    """A named table of implementations with a one-line description each.

    Lookups of an unknown name fail with the nearest registered names, so a typo in a recipe is
    caught before any model loads. `adopts_plain=False`: an undecorated user object is not taken by
    this registry (group rewards must say so with the decorator; a plain function is a per-sample
    reward).
    """

    def __init__(self, kind: str, adopts_plain: bool = True, declares: type | None = None):
        self.kind = kind
        self.adopts_plain = adopts_plain
        self.declares = declares
        self._items: dict[str, T] = {}
        self._docs: dict[str, str] = {}
        self._specs: dict[str, Any] = {}
        _ALL.append(self)

    def register(self, name: str, description: str | None = None, **declaration: Any) -> Callable[[T], T]:
        """Decorator adding `obj` under `name`, with its declaration (the `declares` record's fields)."""
        spec = self._declaration(name, declaration)

        def add(obj: T) -> T:
            if name in self._items and not redefines(self._items[name], obj):
                old = self._items[name]
                where = f"{getattr(old, '__module__', '?')}.{getattr(old, '__qualname__', type(old).__name__)}"
                raise ValueError(f"{self.kind} {name!r} is already registered (by {where}); choose another name")
            self._add(name, obj, description, spec)
            return obj

        return add

    def _declaration(self, name: str, declaration: dict[str, Any]) -> Any:
        if self.declares is None:
            if declaration:
                raise TypeError(f"{self.kind} {name!r}: this registry takes no declaration ({sorted(declaration)})")
            return None
        known = {f.name for f in fields(self.declares)}
        unknown = sorted(set(declaration) - known)
        if unknown:
            raise TypeError(f"{self.kind} {name!r}: unknown declaration {unknown}; a {self.kind} declares "
                            f"{sorted(known)}")
        return self.declares(**declaration)

    def _add(self, name: str, obj: T, description: str | None, spec: Any = None) -> None:
        self._items[name] = obj
        self._specs[name] = spec if spec is not None or self.declares is None else self.declares()
        doc = description or (getattr(obj, "__doc__", None) or "").strip().splitlines()
        self._docs[name] = doc if isinstance(doc, str) else (doc[0] if doc else "")

    def spec(self, name: str) -> Any:
        """The declaration `name` was registered with (the record's defaults when it declared nothing)."""
        self.get(name)
        return self._specs[name]

    def specs(self) -> dict[str, Any]:
        """Every registered name with its declaration, for checks and lists derived from them."""
        return {name: self._specs[name] for name in self.names()}

    def _adopt_user_code(self, spec: str) -> bool:
        """Import `spec` and add it under that name if it belongs here; False if it belongs elsewhere."""
        obj = load_user_object(spec)
        if spec in self._items:  # the import registered the spec itself
            return True
        own = next((n for n, v in self._items.items() if v is obj), None)
        if own is not None:
            self._add(spec, obj, self._docs[own], self._specs[own])
            return True
        registered_elsewhere = any(v is obj for r in _ALL if r is not self for v in r._items.values())
        if registered_elsewhere or not self.adopts_plain:
            return False
        self._add(spec, obj, None)
        return True

    def get(self, name: str) -> T:
        if name not in self:
            raise KeyError(self.unknown_message(name))
        return self._items[name]

    def unknown_message(self, name: str) -> str:
        if is_user_code(name):
            obj = load_user_object(name)
            owners = [r.kind for r in _ALL if r is not self and any(v is obj for v in r._items.values())]
            where = f"its file registers it as a {owners[0]}" if owners else "register it with this registry's decorator"
            return f"{name} is not a {self.kind} ({where})"
        near = difflib.get_close_matches(name, list(self._items), n=3)
        hint = f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""
        return f"unknown {self.kind} {name!r}{hint} (registered: {', '.join(sorted(self._items))})"

    def check_knobs(self, name: str, knobs: dict[str, Any], passed: int = 0, **binding: Any) -> None:
        """`check_knobs` for entry `name` (a registered class is bound through its constructor)."""
        check_knobs(self.get(name), knobs, f"{self.kind} {name!r}", passed, **binding)

    def name_of(self, obj: object) -> str | None:
        """The name `obj` itself is registered under (None if it is not): a Python object passed in place of a name."""
        return next((n for n, v in self._items.items() if v is obj), None)

    def describe(self, name: str) -> str:
        return self._docs[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        if name in self._items:
            return True
        return is_user_code(name) and self._adopt_user_code(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
