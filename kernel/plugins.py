"""Plugin modules: files outside the project's packages that register an algorithm (or any
other registry's entry) when imported, e.g. `algorithm_register(RWL)` at their end.

`RFT_PLUGINS` (rftweb/settings.py) names them; every Django process imports them at start
(`apps.runs` ready: the web, the Celery workers, commands, a learner gang's followers), so
the config validates their names and a worker trains them. A learner gang's rank 0 also
writes the modules it loaded into the gang's spec, and each follower imports those before it
reads the run's config (workers.trainer.follower): a rank started by `join` on another
host trains what rank 0 trains whatever its own environment says.

A plugin module that holds an objective imports `workers.algorithms` (torch) when imported:
naming it in a web process's RFT_PLUGINS brings torch into that process.

No Django, no torch: the kernel's."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

# The plugin modules this process imported through `plugins_load`, in order.
LOADED: list[str] = []


class PluginMissing(ImportError):
    """A plugin module named to be loaded cannot be imported."""


def plugins_load(modules: Iterable[str], *, where: str = "RFT_PLUGINS") -> list[str]:
    """Import each of `modules` (dotted names; blanks skipped) once; returns every plugin
    module this process has loaded. PluginMissing names the module and `where` it was named."""
    for raw in modules:
        name = raw.strip()
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise PluginMissing(f"{where}: the plugin module {name!r} cannot be imported here: {exc}") from exc
        if name not in LOADED:
            LOADED.append(name)
    return list(LOADED)


def plugins_loaded() -> list[str]:
    """The plugin modules this process loaded (what a learner gang's followers load too)."""
    return list(LOADED)
