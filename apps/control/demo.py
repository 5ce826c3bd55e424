"""The demo taskset that `manage.py rft_demo_model` writes next to the demo model."""

from __future__ import annotations

from pathlib import Path
from django.conf import settings
from django.contrib.auth.models import User

from apps.buffer.importers import ImportFailed, taskset_import
from apps.buffer.models import Taskset

# Same names as workers.models.demo.TASKSET_FILE / HELDOUT_FILE; repeated so this module stays torch-free.
DEMO_TASKSET_FILE = "demo-taskset.jsonl"
DEMO_HELDOUT_FILE = "demo-heldout.jsonl"


def demo_taskset_path(*, model_dir: str | Path | None = None) -> Path:
    return Path(model_dir or settings.RFT_DEMO_MODEL_DIR) / DEMO_TASKSET_FILE


def demo_taskset_import(*, owner: User | None = None, name: str = "demo arithmetic", model_dir: str | Path | None = None,
                        heldout: bool = False) -> Taskset:
    """Import the demo taskset (math domain, reference answers), or with `heldout` the problems
    the demo run evaluates on; ImportFailed if the demo model has not been built yet."""
    path = demo_taskset_path(model_dir=model_dir)
    if heldout:
        path = path.with_name(DEMO_HELDOUT_FILE)
    if not path.is_file():
        raise ImportFailed(f"{path}: no demo taskset; build it with `manage.py rft_demo_model`")
    return taskset_import(name=name, path=path, owner=owner)
