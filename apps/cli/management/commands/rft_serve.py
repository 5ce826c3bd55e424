"""Serve rftweb on one machine.

With Redis configured, this is the web process alone (start workers with `manage.py rft
worker`). In the embedded default (no REDIS_URL) the broker and the channel layer live in
this process, so the Celery workers run here too, as threads beside the ASGI server; that
is the one place where the web process hosts torch (DESIGN.md: the embedded default).
Without DATABASE_URL it runs on the private PostgreSQL under VAR_DIR (rftweb/localpg),
starting it if no command before did, and stops it when it exits.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery import signals
from celery.beat import Service

from rftweb.celery import QUEUES
from rftweb import localpg
from rftweb.localpg.base import embedded_cluster
from rftweb.celery import app
from rftweb.localpg.base import embedded_stop

WORKER_MODULES = ["workers.explore.explorer", "workers.explore.chat", "workers.trainer.task", "workers.reward.scoring", "workers.explore.synthesize", "workers.reward.trainer",
                  "workers.weights.download"]


class Command(BaseCommand):
    help = "Serve the web app (and, in the embedded default, the Celery workers in the same process)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--workers", choices=["auto", "yes", "no"], default="auto",
            help="run Celery workers in this process (auto: only in the embedded default)",
        )
        parser.add_argument("--threads", type=int, default=4, help="worker threads when workers run here")

    def handle(self, *args: object, host: str, port: int, workers: str, threads: int, **options: object) -> None:
        from daphne.endpoints import build_endpoint_description_strings

        # Loading this command (its --help, the docs' reference) must not build the application.
        # heavy: importing rftweb.asgi builds the ASGI application and installs daphne's guard.
        from rftweb.asgi import application

        in_process = workers == "yes" or (workers == "auto" and not settings.REDIS_URL)
        if in_process and settings.REDIS_URL and workers == "auto":
            in_process = False
        endpoints = build_endpoint_description_strings(host=host, port=port)
        database = self._database()
        broker = "Redis broker" if settings.REDIS_URL else "in-process broker"
        self.stdout.write(f"rftweb on http://{host}:{port}/ ({database}, {broker})")
        try:
            self._serve(application, endpoints, in_process=in_process, threads=threads)
        finally:
            _embedded_postgres_stop()

    def _database(self) -> str:
        """Which database this server runs on, said on its first line; the embedded default's
        private PostgreSQL is started here (if a command before did not) so the line is true."""
        if not settings.EMBEDDED:
            db = settings.DATABASES["default"]
            return f"PostgreSQL at {db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"

        cluster = embedded_cluster()
        localpg.ensure_running(cluster, database=str(settings.DATABASES["default"]["NAME"]))
        return f"private {localpg.version()} in {cluster.data}, stopped with this server"

    def _serve(self, application: object, endpoints: list[str], *, in_process: bool, threads: int) -> None:
        from daphne.server import Server

        if not in_process:
            # Said, since runs started here advance only where workers serve this broker.
            self.stdout.write("workers: none in this process; runs advance once Celery workers serve "
                              f"{'this Redis' if settings.REDIS_URL else 'the queues'} "
                              "(`celery -A rftweb worker`, or --workers yes)")
            Server(application=application, endpoints=endpoints).run()
            return
        if threads < 2:
            raise CommandError("--threads must be at least 2: the explorer and the trainer run side by side")
        server = Server(application=application, endpoints=endpoints, signal_handlers=False)
        threading.Thread(target=server.run, name="asgi-server", daemon=True).start()
        # Beat as a thread: `worker -B` forks it into a process of its own, whose in-memory
        # broker the workers here would never see.
        from celery.beat import EmbeddedService


        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        beat = EmbeddedService(app, thread=True, schedule_filename=str(settings.VAR_DIR / "celerybeat-schedule"))
        beat.start()
        signals.worker_shutting_down.connect(_stop_promptly(beat), weak=False)
        self.stdout.write(f"workers: {threads} threads serving {', '.join(QUEUES)}; Ctrl+C stops everything")
        app.worker_main(
            ["worker", "-P", "threads", "-c", str(threads), "-Q", ",".join(QUEUES), "-l", "info",
             "-n", "embedded@%h", *[arg for module in WORKER_MODULES for arg in ("-I", module)]]
        )


def _stop_promptly(beat: Service) -> Callable[..., None]:
    """What SIGTERM (or Ctrl+C) does to the embedded default: Celery begins its warm shutdown,
    the beat stops at once, and the process is gone within RFT_SERVE_STOP_SECONDS whatever is
    still running. Celery alone waited for its pool, its beat and its in-memory broker (7 to
    17 s measured on an idle, loaded host), while a process manager or `make run`'s Ctrl+C
    expects an exit. Nothing is lost by it: the in-memory broker dies with the process anyway,
    and the loop's Dispatch rows send every unfinished step again at the next start."""

    def on_shutdown(sig: object = None, how: object = None, exitcode: int | None = None, **_: object) -> None:
        beat.stop()
        grace = settings.RFT_SERVE_STOP_SECONDS

        def leave() -> None:
            time.sleep(grace)
            logging.getLogger(__name__).warning("rft_serve: stopped after %.1f s of shutdown", grace)
            # os._exit skips the `finally` that stops the embedded default's PostgreSQL.
            _embedded_postgres_stop()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(exitcode or 0))

        threading.Thread(target=leave, name="rft-serve-exit", daemon=True).start()

    return on_shutdown


def _embedded_postgres_stop() -> None:
    """The embedded default's private PostgreSQL stops with the server (once: the prompt exit
    and the normal return may both get here)."""
    if not settings.EMBEDDED:
        return

    if embedded_stop():
        logging.getLogger(__name__).info("rft_serve: stopped the private PostgreSQL")
