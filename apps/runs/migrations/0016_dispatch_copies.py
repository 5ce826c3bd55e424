# A dispatch row counts the copies of its current message (apps/control/conductor.py backs
# off re-sending a message that waits on a busy queue).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0015_dispatch_job'),
    ]

    operations = [
        migrations.AddField(
            model_name='dispatch',
            name='copies',
            field=models.PositiveIntegerField(default=0),
        ),
    ]
