from django.apps import AppConfig
from django.conf import settings

from kernel.plugins import plugins_load


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Access that narrows is told to the open sockets (apps/runs/access_signals.py).
        # app loading: apps.py loads before the models, ready() after them.
        from apps.runs.access_signals import access_signals_connect

        access_signals_connect()
        # Plugin modules named by RFT_PLUGINS register their algorithms (and any other
        # registry's entries) in every process before a config is read (kernel/plugins.py).
        plugins_load(settings.RFT_PLUGINS)
