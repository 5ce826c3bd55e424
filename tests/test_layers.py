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

    for name in ("apps", "workers", "rftweb"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "migrations"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "apps" / "runs" / "metrics.py").open("a") as f:
        f.write("\n\ndef _upward() -> None:\n    from apps.control import views  # noqa: F401\n")
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "apps.runs is not allowed to import apps.control" in result.stdout
    assert "apps.runs.metrics -> apps.control.views" in result.stdout


def test_the_apps_above_fill_the_kernels_config_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel validates reward and operator names it cannot import: the rewards and buffer
    apps register them when Django loads them (AppConfig.ready); without them a config is
    refused loudly, never accepted with any name."""
    from apps.runs import vocabulary
    from apps.runs.config import config_validate

    assert {"exact_match", "math_accuracy", "k12_judge"} <= set(vocabulary.reward_names())
    assert {"human_flagged", "priority_replay"} <= set(vocabulary.operator_names())
    with pytest.raises(Exception, match="unknown reward 'exact_match_typo'"):
        config_validate(data={"model": "x", "rewards": [{"name": "exact_match_typo"}]})
    monkeypatch.setattr(vocabulary, "_VOCABULARY", vocabulary._Vocabulary())
    with pytest.raises(vocabulary.VocabularyMissing, match="no reward functions are registered"):
        config_validate(data={"model": "x", "rewards": [{"name": "exact_match"}]})
