from django.apps import AppConfig


class EnvapiConfig(AppConfig):
    name = "apps.envapi"
    label = "envapi"
    default_auto_field = "django.db.models.BigAutoField"
