from django.apps import AppConfig


class EnvapiConfig(AppConfig):
    name = "apps.envapi"
    label = "envapi"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A deleted account's keys are revoked with it (apps/envapi/signals.py).
        # app loading: apps.py loads before the models, ready() after them.
        from apps.envapi.signals import key_signals_connect

        key_signals_connect()
