"""Django's PostgreSQL backend for the embedded default's private server (rftweb.localpg):
the first connection a process opens starts the server when it is not running, so every
command (migrate, rft_demo, rft_serve, rft …, shell, dbshell) finds its database; a
connection refused later (the server stopped under a long-lived process) starts it again,
except in a process that stopped it itself (rft_serve on its way out)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.backends.postgresql import base, client

from rftweb import localpg


def embedded_cluster() -> localpg.Cluster:
    return localpg.Cluster(data=Path(settings.EMBEDDED_POSTGRES_DIR))


def _ensure() -> bool:
    """The server up with the configured database in it (not the database a connection
    names: pytest-django's test database is Django's to make); True when this started it.
    Never once this process stopped it: a worker thread's query during rft_serve's exit
    would start it again, to outlive the server."""
    if _stopped.is_set():
        return False
    return localpg.ensure_running(embedded_cluster(), database=str(settings.DATABASES["default"]["NAME"]))


def embedded_stop() -> bool:
    """Stop the private server for good in this process (rft_serve's exit); True when it was
    running. Safe from several threads at once (localpg.stop takes the cluster's lock)."""
    _stopped.set()
    return localpg.stop(embedded_cluster())


_stopped = threading.Event()


class DatabaseClient(client.DatabaseClient):
    """`manage.py dbshell`: the wheel's psql (a machine without PostgreSQL has none on PATH),
    the server started first."""

    @classmethod
    def settings_to_cmd_args_env(cls, settings_dict: dict[str, Any], parameters: Iterable[str]) -> tuple[list[str], Any]:
        args, env = super().settings_to_cmd_args_env(settings_dict, parameters)
        return [str(localpg.bin_dir() / "psql"), *args[1:]], env

    def runshell(self, parameters: Iterable[str]) -> None:
        _ensure()
        super().runshell(parameters)


class DatabaseWrapper(base.DatabaseWrapper):
    client_class = DatabaseClient

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        global _seen_running
        if not _seen_running:
            _ensure()
            _seen_running = True
        try:
            return super().get_new_connection(conn_params)
        except self.Database.OperationalError:
            if not _ensure():
                raise
            return super().get_new_connection(conn_params)


# Checked once per process, then again only when a connection is refused.
_seen_running = False
