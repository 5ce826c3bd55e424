from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Access that narrows is told to the open sockets (apps/runs/access_signals.py).
        # app loading: apps.py loads before the models, ready() after them.
        from apps.runs.access_signals import access_signals_connect

        access_signals_connect()
