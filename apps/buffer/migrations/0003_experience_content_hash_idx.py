"""An index for the pipeline's exact dedup: (run, metadata->>'content_hash').

An expression index, created with SQL so the Experience model stays as it is.
"""

from django.db import migrations

NAME = "experience_content_hash_idx"


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {NAME} ON buffer_experience (run_id, ((metadata ->> 'content_hash')))"
    )


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    schema_editor.execute(f"DROP INDEX IF EXISTS {NAME}")


class Migration(migrations.Migration):
    dependencies = [("buffer", "0002_initial")]

    operations = [migrations.RunPython(create, drop)]
