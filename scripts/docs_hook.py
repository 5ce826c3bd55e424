"""mkdocs hook (mkdocs.yml `hooks:`): write the generated reference pages before each build,
so `mkdocs build` and `mkdocs serve` always show the code as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

SCRIPT = Path(__file__).resolve().parent / "docs_reference.py"


def on_pre_build(config: Any, **kwargs: Any) -> None:
    # A child process: the generator sets Django up, which the mkdocs process should not hold.
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise PluginError(f"scripts/docs_reference.py failed:\n{done.stdout}{done.stderr}")
