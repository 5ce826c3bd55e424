# An agent call's kind is the OpenAI-compatible endpoint that took it, chat or completion
# (issue #65 item 4: "kind" names a plugin of a family only).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('envapi', '0002_agent_sessions'),
    ]

    operations = [
        migrations.RenameField(
            model_name='agentcall',
            old_name='kind',
            new_name='endpoint',
        ),
    ]
