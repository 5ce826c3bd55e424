"""The audit action `feedback_policy` is renamed `feedback_settings` (one word per meaning:
docs/concepts.md, Names); existing rows follow, and the reverse puts them back."""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

OLD, NEW = "feedback_policy", "feedback_settings"


def _rename(apps: StateApps, *, before: str, after: str) -> None:
    apps.get_model("runs", "AuditEntry").objects.filter(action=before).update(action=after)


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _rename(apps, before=OLD, after=NEW)


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _rename(apps, before=NEW, after=OLD)


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0012_sync_failure'),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]
