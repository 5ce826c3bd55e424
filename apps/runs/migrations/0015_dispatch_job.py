# A dispatch row's kind is its job (issue #65 item 4: "kind" names a plugin of a family only).
# Django has no operation that renames a constraint, so the unique one goes and comes back
# under its new name around the column's rename (the table holds a few rows per run).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0014_learner_gang'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='dispatch',
            name='dispatch_run_kind_key_unique',
        ),
        migrations.RenameField(
            model_name='dispatch',
            old_name='kind',
            new_name='job',
        ),
        migrations.AddConstraint(
            model_name='dispatch',
            constraint=models.UniqueConstraint(fields=('run', 'job', 'key'), name='dispatch_run_job_key_unique'),
        ),
    ]
