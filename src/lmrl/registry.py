"""One tiny generic registry used by every stage: implementations are chosen by name in the config."""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of implementations with a one-line description each.

    Lookups of an unknown name fail with the nearest registered names, so a typo in a recipe is
    caught before any model loads.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._docs: dict[str, str] = {}

    def register(self, name: str, description: str | None = None) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            doc = description or (getattr(obj, "__doc__", None) or "").strip().splitlines()
            self._docs[name] = doc if isinstance(doc, str) else (doc[0] if doc else "")
            return obj

        return add

    def get(self, name: str) -> T:
        if name not in self._items:
            raise KeyError(self.unknown_message(name))
        return self._items[name]

    def unknown_message(self, name: str) -> str:
        near = difflib.get_close_matches(name, list(self._items), n=3)
        hint = f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""
        return f"unknown {self.kind} {name!r}{hint} (registered: {', '.join(sorted(self._items))})"

    def describe(self, name: str) -> str:
        return self._docs[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
