"""The rooms stay readable (issue #48 item 4), as scripts/rooms.py measures them: no function
over 80 lines where this round cut them, and private names imported across modules only where
the modules' owners have yet to switch (listed, so that the list can only shrink)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def rooms() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rooms_script", ROOT / "scripts" / "rooms.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


# The one file whose private cross-module imports wait on another change: the trainer package
# re-exports resident.py's and step.py's private names that the tests reach in for.
WAITING = ("workers/trainer/__init__.py",)
# The one product function over 80 lines left (the demo model's build, 85).
LONG_LEFT = ("workers/demo_model.py",)


def test_no_product_function_is_over_80_lines() -> None:
    long = [f for f in rooms().findings() if f.kind == "long"]
    assert [f for f in long if not f.path.startswith(LONG_LEFT)] == []


def test_private_names_cross_modules_only_where_a_change_is_waited_for() -> None:
    private = [f for f in rooms().findings() if f.kind == "private-import"]
    assert [f for f in private if not f.path.startswith(WAITING)] == []
