"""A twin names the run it copies (`Run.twin_of`), so that every door refuses labels on it by
one check read with the run (issue #62 item 4). Twins made before were linked by their
`copied_as_twin` audit entry only ({"of": the run's id}): their column is filled from it."""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
import django.db.models.deletion


def twins_forward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    run_model = apps.get_model("runs", "Run")
    entry_model = apps.get_model("runs", "AuditEntry")
    for entry in entry_model.objects.filter(action="copied_as_twin").order_by("created_at"):
        of = (entry.detail or {}).get("of")
        if isinstance(of, int) and run_model.objects.filter(pk=of).exists():
            run_model.objects.filter(pk=entry.run_id).update(twin_of_id=of)


class Migration(migrations.Migration):
    dependencies = [("runs", "0010_trainer_params")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="twin_of",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                                    related_name="twins", to="runs.run"),
        ),
        migrations.RunPython(twins_forward, migrations.RunPython.noop),
    ]
