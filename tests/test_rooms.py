"""The rooms stay readable (issue #48 item 4), as scripts/rooms.py measures them: no product
function over 80 lines, and no private name imported from another module."""

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




def test_no_product_function_is_over_80_lines() -> None:
    long = [f for f in rooms().findings() if f.kind == "long"]
    assert long == []


def test_no_private_name_is_imported_from_another_module() -> None:
    private = [f for f in rooms().findings() if f.kind == "private-import"]
    assert private == []
