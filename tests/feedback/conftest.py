"""Helpers of the annotation page tests; the server, the browser and `page` come from
tests/servers.py."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.servers import ROOT, child_env, login

__all__ = ["login", "worker_write"]


def worker_write(run_id: int, rows: list[dict[str, Any]] | None = None, event: dict[str, Any] | None = None,
                 events: list[dict[str, Any]] | None = None) -> list[int]:
    """Write experiences from another process, as a rollout worker does, and announce them
    (or only publish `event`, or `events` back to back)."""
    spec: dict[str, Any] = {"run_id": run_id, "rows": rows or []}
    if event is not None:
        spec["event"] = event
    if events is not None:
        spec["events"] = events
    result = subprocess.run(
        [sys.executable, "-m", "tests.feedback.worker", json.dumps(spec)],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])["ids"]
