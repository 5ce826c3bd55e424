"""One shape for the registries that make rftweb extensible (algorithms and their objectives,
feedback kinds, reward functions and domains, pipeline operators, preferences): declarations
registered by name, the built-in ones loaded from their modules on first use, listed
built-ins first in their declared order, then in registration order. No Django, no torch:
the web side and the workers both use it."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from dataclasses import is_dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, *, what: str, package: str, builtin: Sequence[str] = (), suffix: str = "") -> None:
        self.what = what  # "algorithm", "feedback kind": how errors name an entry
        self.package = package  # the built-ins are its modules `<package>.<name>`
        self.builtin = tuple(builtin)
        # Discovery instead of a list: every module of `package` whose name ends with `suffix`
        # (`_rules`: apps/rewards/math_rules.py), imported in name order; none when empty.
        self.suffix = suffix
        self._entries: dict[str, T] = {}
        self._loaded = False

    def add(self, name: str, entry: T) -> None:
        """Register `entry` as `name`; the same declaration again is a no-op (a module
        imported twice), another one under a taken name an error. A declaration is the same
        when it is of the same class and, for a dataclass record (a reward, a domain route),
        equal to the one registered."""
        known = self._entries.get(name)
        if known is not None and (type(known) is not type(entry) or (is_dataclass(entry) and known != entry)):
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry

    def remove(self, name: str) -> None:
        """Take an entry out again (tests that register one of their own)."""
        self._entries.pop(name, None)

    def load(self) -> None:
        # Once per process: the lookups of a hot path (a reward per completion) skip it.
        if self._loaded:
            return
        for module in (*self.builtin, *self.discovered()):
            importlib.import_module(f"{self.package}.{module}")
        self._loaded = True

    def discovered(self) -> list[str]:
        """The modules of `package` named `*<suffix>` (none without a suffix)."""
        if not self.suffix:
            return []
        path = importlib.import_module(self.package).__path__
        return sorted(m.name for m in pkgutil.iter_modules(path) if m.name.endswith(self.suffix))

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
