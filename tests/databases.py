"""The test databases: copied from a migrated template, and emptied between transactional
tests by DELETE rather than TRUNCATE (issue 50).

Template: each xdist worker (and each
bench database a smoke test uses) was migrated from nothing, a minute of work a worker on a
loaded 2-core host. Now the first session after a migration changes migrates one template,
`<test database>_tpl_<key>`, and every test database is `CREATE DATABASE ... TEMPLATE` of it
(a file copy inside PostgreSQL: well under a second).

The key is a hash of every migration file Django's loader finds (the project's and the
installed apps' own) and Django's version: a changed, added or removed migration makes a new
template; the old ones of that test database are dropped then. A template is migrated under
another name and renamed when done, so one half-built by a killed run is never copied, and
xdist workers wait for each other on a PostgreSQL advisory lock (one builds, the others
copy). RFT_TEST_TEMPLATE_DB=0 turns it off (pytest-django then migrates each test database).

Flush: after each transactional test (a live server's, a Celery worker's: ~290 of the suite)
Django empties every table with one TRUNCATE, which gives each of the ~40 tables and their
indexes new files and syncs them: 2.2-3.0 s a test at load 10 on this host, where a DELETE
from each table, in one transaction with the (deferrable) foreign keys checked at its commit,
took 0.24-0.36 s. The tables hold a test's few rows, so the dead rows it leaves are few too.
A flush that resets sequences or cascades is Django's own still.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

# Any fixed 64-bit number: the advisory lock every checkout's template build and copy take.
_LOCK = 0x7266_7477_6562_7470  # "rftwebtp"


def template_wanted() -> bool:
    return os.environ.get("RFT_TEST_TEMPLATE_DB", "1") != "0"


def migrations_key() -> str:
    """12 hex digits of a hash of every migration file the loader finds, and Django's version."""
    import inspect
    import sys

    import django
    from django.db.migrations.loader import MigrationLoader

    digest = hashlib.sha256(django.get_version().encode())
    loader = MigrationLoader(None, ignore_no_migrations=True)
    for key in sorted(loader.disk_migrations):
        module = sys.modules[type(loader.disk_migrations[key]).__module__]
        digest.update(repr(key).encode())
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()[:12]


@contextmanager
def _admin(settings_dict: dict[str, Any]) -> Iterator[Any]:
    """An autocommit connection to the server's `postgres` database, holding the advisory lock."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    params: dict[str, Any] = {"dbname": "postgres", "host": settings_dict.get("HOST") or "localhost",
                              "port": settings_dict.get("PORT") or 5432, "user": settings_dict.get("USER") or None,
                              "password": settings_dict.get("PASSWORD") or None}
    conninfo = make_conninfo("", **{k: v for k, v in params.items() if v is not None})
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK,))
        try:
            yield conn
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK,))


def _exists(conn: Any, name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def _drop(conn: Any, name: str) -> None:
    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_from_template(*, settings_dict: dict[str, Any], base: str, names: list[str],
                           migrate: Callable[[str], None]) -> str:
    """Each of `names` made afresh as a copy of `base`'s template for the migrations as they
    are (built first, by `migrate(database name)`, where none is); returns the template's name."""
    template = f"{base}_tpl_{migrations_key()}"
    building = f"{template}_building"
    with _admin(settings_dict) as conn:
        if not _exists(conn, template):
            stale = [row[0] for row in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{base}\\_tpl\\_%",))]
            for name in stale:
                _drop(conn, name)
            conn.execute(f'CREATE DATABASE "{building}"')
            migrate(building)
            conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{template}"')
        for name in names:
            _drop(conn, name)
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return template


def migrate_into(name: str) -> None:
    """Migrate the database `name` with this process's Django connection (as Django's own test
    database creation does: the connection pointed at it for the while), then close it."""
    from django.core.management import call_command
    from django.db import connection

    saved = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = name
    try:
        call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)
    finally:
        connection.close()
        connection.settings_dict["NAME"] = saved


def flush_by_delete_install() -> None:
    """PostgreSQL's `sql_flush` (what `manage.py flush`, run after each transactional test,
    sends) as DELETEs for this process: see the module's docstring."""
    from django.core.management.color import Style
    from django.db.backends.base.operations import BaseDatabaseOperations
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush
    if getattr(truncate, "by_delete", False):
        return

    def sql_flush(self: BaseDatabaseOperations, style: Style, tables: Sequence[str], *, reset_sequences: bool = False,
                  allow_cascade: bool = False) -> list[str]:
        if reset_sequences or allow_cascade or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return ["SET CONSTRAINTS ALL DEFERRED", *(f"DELETE FROM {self.quote_name(table)}" for table in tables)]

    sql_flush.by_delete = True  # type: ignore[attr-defined]
    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
