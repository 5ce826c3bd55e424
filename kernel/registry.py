"""One shape for the registries that make rftweb extensible (algorithms and their objectives,
feedback kinds): declarations registered by name, the built-in ones loaded from their
modules on first use, listed built-ins first in their declared order, then in registration
order. No Django, no torch: the web side and the workers both use it."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, *, what: str, package: str, builtin: Sequence[str]) -> None:
        self.what = what  # "algorithm", "feedback kind": how errors name an entry
        self.package = package  # the built-ins are its modules `<package>.<name>`
        self.builtin = tuple(builtin)
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> None:
        """Register `entry` as `name`; the same declaration again is a no-op (a module
        imported twice), another one under a taken name an error."""
        known = self._entries.get(name)
        if known is not None and type(known) is not type(entry):
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry

    def remove(self, name: str) -> None:
        """Take an entry out again (tests that register one of their own)."""
        self._entries.pop(name, None)

    def load(self) -> None:
        for module in self.builtin:
            importlib.import_module(f"{self.package}.{module}")

    def entries(self) -> list[T]:
        self.load()
        rank = {name: i for i, name in enumerate(self.builtin)}
        order = sorted(self._entries, key=lambda name: rank.get(name, len(rank)))
        return [self._entries[name] for name in order]

    def names(self) -> list[str]:
        self.load()
        rank = {name: i for i, name in enumerate(self.builtin)}
        return sorted(self._entries, key=lambda name: rank.get(name, len(rank)))

    def get(self, name: object) -> T:
        """The entry registered as `name` (a str or a str enum); ValueError naming the
        known ones otherwise."""
        self.load()
        key = str(getattr(name, "value", name))
        try:
            return self._entries[key]
        except KeyError:
            raise ValueError(f"unknown {self.what} {key!r}; known: {', '.join(self.names())}") from None
