"""Run lifecycle actions that need the layers above the kernel: a run created together with
the import of its taskset file (apps.buffer's importers)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from django.contrib.auth.models import User
from django.db import transaction

from apps.buffer.importers import taskset_import
from apps.buffer.models import Taskset
from kernel.config import ConfigInvalid, RunConfig
from apps.runs.models import Run
from apps.runs.services import run_create, run_name_errors, run_spec_check


def run_create_with_taskset(
    *,
    name: str,
    owner: User,
    config: Mapping[str, object] | RunConfig,
    taskset: Taskset | None = None,
    taskset_path: str | Path | None = None,
    taskset_name: str | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> Run:
    """Create a draft run, importing its taskset file (JSONL, Parquet or a datasets
    directory) in the same transaction: a bad config (ConfigInvalid) is found before any
    import, and a bad taskset (ImportFailed) leaves neither a taskset nor a run behind."""
    # Every error at once (a blank name too), before any import.
    errors = run_name_errors(name=name)
    cfg, spec_errors = run_spec_check(config=config, taskset=taskset)  # validated once, passed on
    errors.update(spec_errors)
    if errors or cfg is None:
        raise ConfigInvalid(errors)
    with transaction.atomic():
        if taskset_path is not None:
            path = Path(taskset_path)
            taskset = taskset_import(name=taskset_name or path.stem, path=path, owner=owner, progress=progress)
        return run_create(name=name, owner=owner, config=cfg, taskset=taskset)
