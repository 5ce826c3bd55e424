"""The test databases (tests/databases.py): copies of a template migrated once per set of
migrations (the copy is fully migrated, a changed migration set builds a new template and the
old one is dropped, a template is built once however many copies are made), emptied after a
transactional test by DELETEs that leave no row behind, linked rows included."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests import databases as template_db


def test_the_test_database_has_every_migration_applied(db: None) -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []


def test_the_key_is_a_hash_of_the_migrations_as_they_are() -> None:
    key = template_db.migrations_key()
    assert len(key) == 12 and int(key, 16) >= 0
    assert template_db.migrations_key() == key


def _url(settings_dict: dict[str, Any], name: str) -> str:
    host, port = settings_dict.get("HOST") or "localhost", settings_dict.get("PORT") or 5432
    user = settings_dict.get("USER")
    return f"postgresql://{user + '@' if user else ''}{host}:{port}/{name}"


def _databases(settings_dict: dict[str, Any], like: str) -> set[str]:
    with psycopg.connect(_url(settings_dict, "postgres"), autocommit=True) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (like,))}


def test_copies_come_from_one_build_per_migration_set_and_an_old_template_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import connection

    settings_dict = connection.settings_dict
    base = f"{settings_dict['TEST'].get('NAME') or 'test'}_tplcheck"
    built: list[str] = []

    def migrate(name: str) -> None:
        built.append(name)
        with psycopg.connect(_url(settings_dict, name), autocommit=True) as conn:
            conn.execute("CREATE TABLE migrated (key text)")
            conn.execute("INSERT INTO migrated VALUES (%s)", (key[0],))

    def marker(name: str) -> str:
        with psycopg.connect(_url(settings_dict, name), autocommit=True) as conn:
            row = conn.execute("SELECT key FROM migrated").fetchone()
            assert row is not None
            return str(row[0])

    key = ["aaaaaaaaaaaa"]
    monkeypatch.setattr(template_db, "migrations_key", lambda: key[0])
    copies = [f"{base}_a", f"{base}_b"]
    try:
        first = template_db.database_from_template(settings_dict=settings_dict, base=base, names=copies, migrate=migrate)
        again = template_db.database_from_template(settings_dict=settings_dict, base=base, names=copies[:1],
                                                   migrate=migrate)
        assert first == again == f"{base}_tpl_aaaaaaaaaaaa"
        assert built == [f"{first}_building"], "built under another name, once"
        assert [marker(name) for name in copies] == ["aaaaaaaaaaaa"] * 2

        key[0] = "bbbbbbbbbbbb"  # a migration changed
        changed = template_db.database_from_template(settings_dict=settings_dict, base=base, names=copies[:1],
                                                     migrate=migrate)
        assert changed == f"{base}_tpl_bbbbbbbbbbbb" and len(built) == 2
        assert marker(copies[0]) == "bbbbbbbbbbbb"
        assert _databases(settings_dict, f"{base}_tpl%") == {changed}, "the old template stays"
    finally:
        with psycopg.connect(_url(settings_dict, "postgres"), autocommit=True) as conn:
            for name in _databases(settings_dict, f"{base}%"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.django_db(transaction=True)
def test_the_flush_after_a_transactional_test_empties_every_table_linked_rows_included(owner: Any) -> None:
    from django.apps import apps
    from django.core.management import call_command
    from django.core.management.color import no_style
    from django.db import connection

    from apps.runs.models import Run
    from tests.factories import add_member, make_run, make_user

    run = make_run(owner=owner)
    add_member(run, make_user("member"))
    assert "DELETE FROM" in " ".join(connection.ops.sql_flush(no_style(), ["runs_run"]))
    # What pytest-django runs after the test (less the post_migrate that refills content types).
    call_command("flush", verbosity=0, interactive=False, inhibit_post_migrate=True)
    assert not Run.objects.exists()
    counts = {m._meta.db_table: m._default_manager.count() for m in apps.get_models() if m._meta.managed}
    assert counts and set(counts.values()) == {0}, {t: n for t, n in counts.items() if n}
