"""The learner processes that train one run's step together are a learner *gang* (issue #65
item 4: *group* means an experience group only). A lost rank's failure is stored under that
name (`workers.trainer.task.GANG_LOST_TASK`); the rows stored before under "learner group"
are renamed, so that the run page's worker-errors panel reads one name for them."""

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

OLD, NEW = "learner group", "learner gang"


def gang_forward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("runs", "TaskFailure").objects.filter(task=OLD).update(task=NEW)


def gang_backward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("runs", "TaskFailure").objects.filter(task=NEW).update(task=OLD)


class Migration(migrations.Migration):
    dependencies = [("runs", "0012_sync_failure")]

    operations = [migrations.RunPython(gang_forward, gang_backward)]
