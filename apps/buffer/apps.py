from django.apps import AppConfig


class BufferConfig(AppConfig):
    name = "apps.buffer"
    label = "buffer"
    default_auto_field = "django.db.models.BigAutoField"
