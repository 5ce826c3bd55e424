"""The learner processes that train one run's step together are a learner *gang* (issue #65
item 4: *group* means an experience group only). A lost rank's failure is stored under that
name (`workers.trainer.task.GANG_LOST_TASK`) and its exception's class (`GangLost`); the rows
stored before ("learner group", `GroupLost`) are renamed, so that the run page's worker-errors
panel reads one name for them."""

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

OLD = ("learner group", "GroupLost")
NEW = ("learner gang", "GangLost")


def _rename(apps: Apps, source: tuple[str, str], target: tuple[str, str]) -> None:
    rows = apps.get_model("runs", "TaskFailure").objects.filter(task=source[0])
    rows.filter(exception=source[1]).update(exception=target[1])
    rows.update(task=target[0])


def gang_forward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _rename(apps, OLD, NEW)


def gang_backward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _rename(apps, NEW, OLD)


class Migration(migrations.Migration):
    dependencies = [("runs", "0013_audit_feedback_settings")]

    operations = [migrations.RunPython(gang_forward, gang_backward)]
