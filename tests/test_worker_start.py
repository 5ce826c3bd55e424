"""What a Celery worker loads at its start: its tasks, not the site's views (rftweb/celery.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.servers import child_env

ROOT = Path(__file__).resolve().parent.parent

# What a worker does before it takes a task: Django set up, every task module imported, and
# Celery's Django fix-up run on the `import_modules` signal (where its system checks would run).
_START = """
import sys
from rftweb.celery import app
app.loader.import_default_modules()
print(sorted(name for name in ("rftweb.urls", "rftweb.api", "apps.control.views") if name in sys.modules))
print("workers.explore.explorer" in sys.modules and "apps.control.conductor_beat" in sys.modules)
"""


def test_a_workers_start_imports_its_tasks_and_no_view() -> None:
    env = child_env()
    env.pop("CELERY_SKIP_CHECKS", None)  # rftweb.celery's own default decides, not this process's
    out = subprocess.run([sys.executable, "-c", _START], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    views, tasks = out.stdout.strip().splitlines()[-2:]
    assert (views, tasks) == ("[]", "True")
