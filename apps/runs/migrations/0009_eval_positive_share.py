"""Stored `eval/accuracy` rows were the share of evaluated answers scoring above 0, which a
format term alone reaches (a tidy wrong answer scores 0.1 on math): they are renamed
`eval/positive_share`, shown as "share scoring above 0". From now on `eval/accuracy` is the
task domain's verifier (workers/evaluation.py). The run's `eval/best_version` rows stay: they
name the version the old rule picked then."""

from django.db import migrations

OLD, NEW = "eval/accuracy", "eval/positive_share"


def rename(apps, schema_editor):  # type: ignore[no-untyped-def]
    apps.get_model("runs", "Metric").objects.filter(name=OLD).update(name=NEW)


def unrename(apps, schema_editor):  # type: ignore[no-untyped-def]
    apps.get_model("runs", "Metric").objects.filter(name=NEW).update(name=OLD)


class Migration(migrations.Migration):

    dependencies = [("runs", "0008_notifications")]

    operations = [migrations.RunPython(rename, unrename)]
