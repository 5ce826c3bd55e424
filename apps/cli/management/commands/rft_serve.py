"""Serve rftweb on one machine.

With Redis configured, this is the web process alone (start workers with `manage.py rft
worker`). In the embedded default (no REDIS_URL) the broker and the channel layer live in
this process, so the Celery workers run here too, as threads beside the ASGI server; that
is the one place where the web process hosts torch (DESIGN.md: the embedded default).
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from rftweb.celery import QUEUES

WORKER_MODULES = ["workers.explorer", "workers.trainer", "workers.rewards", "workers.synthesize", "workers.reward_trainer"]


class Command(BaseCommand):
    help = "Serve the web app (and, in the embedded default, the Celery workers in the same process)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--workers", choices=["auto", "yes", "no"], default="auto",
            help="run Celery workers in this process (auto: only in the embedded default)",
        )
        parser.add_argument("--threads", type=int, default=4, help="worker threads when workers run here")

    def handle(self, *args: Any, host: str, port: int, workers: str, threads: int, **options: Any) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from rftweb.asgi import application

        in_process = workers == "yes" or (workers == "auto" and not settings.REDIS_URL)
        if in_process and settings.REDIS_URL and workers == "auto":
            in_process = False
        endpoints = build_endpoint_description_strings(host=host, port=port)
        self.stdout.write(f"rftweb on http://{host}:{port}/ ({'embedded: SQLite, in-process broker' if settings.EMBEDDED else 'Postgres'})")
        if not in_process:
            Server(application=application, endpoints=endpoints).run()
            return
        if threads < 2:
            raise CommandError("--threads must be at least 2: the explorer and the trainer run side by side")
        server = Server(application=application, endpoints=endpoints, signal_handlers=False)
        threading.Thread(target=server.run, name="asgi-server", daemon=True).start()
        # Beat as a thread: `worker -B` forks it into a process of its own, whose in-memory
        # broker the workers here would never see.
        from celery.beat import EmbeddedService

        from rftweb.celery import app

        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        EmbeddedService(app, thread=True, schedule_filename=str(settings.VAR_DIR / "celerybeat-schedule")).start()
        self.stdout.write(f"workers: {threads} threads serving {', '.join(QUEUES)}; Ctrl+C stops everything")
        app.worker_main(
            ["worker", "-P", "threads", "-c", str(threads), "-Q", ",".join(QUEUES), "-l", "info",
             "-n", "embedded@%h", *[arg for module in WORKER_MODULES for arg in ("-I", module)]]
        )
