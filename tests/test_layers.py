"""The apps' layers (pyproject.toml [tool.importlinter]) hold: no app imports one above it,
inside functions included, so no two apps import each other. `make test` runs the same
check before mypy; this keeps a plain `pytest` run honest too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "apps are layered KEPT" in result.stdout and " 0 broken" in result.stdout


def test_a_kernel_module_importing_an_upper_app_breaks_the_contract(tmp_path: Path) -> None:
    """The check can fail: a copy of the tree where the kernel imports the control plane is
    refused, naming the import."""
    import shutil

    for name in ("kernel", "apps", "workers", "rftweb"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "migrations"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "apps" / "runs" / "metrics.py").open("a") as f:
        f.write("\n\ndef _upward() -> None:\n    from apps.control import views  # noqa: F401\n")
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "apps.runs is not allowed to import apps.control" in result.stdout
    assert "apps.runs.metrics -> apps.control.views" in result.stdout


def test_a_config_is_validated_without_django() -> None:
    """The kernel validates reward, domain and pipeline-operator names it cannot import: its
    registries load the plugin modules by name, so a process where Django is not set up (no
    DJANGO_SETTINGS_MODULE, no AppConfig.ready) knows every built-in name and refuses a wrong
    one, and Django's app registry is never populated."""
    import os

    code = (
        "import sys\n"
        "from kernel.config import config_validate\n"
        "cfg = config_validate(data={'model': 'x', 'rewards': [{'name': 'math_accuracy', 'domains': ['math']}],\n"
        "    'pipeline': {'on_write': [{'name': 'dedup_exact'}]}})\n"
        "print(cfg.rewards[0].name, cfg.pipeline.on_write[0].name)\n"
        "for bad in ({'name': 'exact_match_typo'}, {'name': 'exact_match', 'domains': ['Math']}):\n"
        "    try:\n"
        "        config_validate(data={'model': 'x', 'rewards': [bad]})\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, str(exc).splitlines()[0])\n"
        "django = sys.modules.get('django.apps')\n"
        "print('apps ready:', bool(django and django.apps.ready))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "math_accuracy dedup_exact"
    assert lines[1].startswith("ConfigInvalid") and "unknown reward 'exact_match_typo'" in lines[1]
    assert lines[2].startswith("ConfigInvalid") and "unknown domain 'Math'" in lines[2]
    assert lines[3] == "apps ready: False"


def test_a_worker_importing_an_apps_model_breaks_the_ports_contract(tmp_path: Path) -> None:
    """Workers reach the apps through their ports only: a copy of the tree where the explorer
    imports the Run model is refused, naming the import; the ports themselves are allowed."""
    import shutil

    for name in ("kernel", "apps", "workers", "rftweb"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "migrations"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "workers" / "explore" / "explorer.py").open("a") as f:
        f.write("\n\ndef _around_the_port() -> None:\n    from apps.runs.models import Run  # noqa: F401\n")
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "workers reach the apps through their ports BROKEN" in result.stdout
    assert "workers.explore.explorer -> apps.runs.models" in result.stdout
    assert "apps are layered KEPT" in result.stdout


def test_no_worker_uses_a_model_manager() -> None:
    """The ports hand workers rows to read (a claimed batch, a reward-model version), never a
    way to query: no module in workers/ calls a manager, refreshes a row, or takes the row
    behind a RunView (`apps.runs.ports.row`, which is for the other apps' ports)."""
    import re

    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted((ROOT / "workers").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), start=1)
             if re.search(r"\.objects\b|\._default_manager\b|\.refresh_from_db\(|\._row\b|\brow\(", line)]
    assert found == []


def test_a_learner_gangs_follower_module_imports_before_django_is_set_up() -> None:
    """A learner gang's follower process (`python -m workers.trainer.follower`) imports
    its module before it calls django.setup(): the learner may import the kernel's pure config
    and algorithm registry there, never a port (which loads the models and would kill the
    follower, leaving the gang's first step waiting for it)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-c", "import workers.trainer.follower, workers.models.demo"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_kernel_imports_without_django() -> None:
    """The kernel needs no Django: in a process where Django is neither set up nor named
    (no DJANGO_SETTINGS_MODULE), every kernel module imports and validates a plain value,
    and Django is still not loaded afterwards."""
    import os

    code = (
        "import pkgutil, importlib, sys, kernel\n"
        "names = [m.name for m in pkgutil.walk_packages(kernel.__path__, 'kernel.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "from kernel.fold import borda_scores\n"
        "assert borda_scores([2, 0, 1]) == {2: 1.0, 0: 0.5, 1: 0.0}\n"
        "loaded = sorted(m for m in sys.modules if m == 'django' or m.startswith(('django.', 'apps', 'rftweb')))\n"
        "print(len(names), loaded)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    count, loaded = result.stdout.split(" ", 1)
    assert int(count) >= 10 and loaded.strip() == "[]", result.stdout
