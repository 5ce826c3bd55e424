from django.apps import AppConfig


class FeedbackConfig(AppConfig):
    name = "apps.feedback"
    label = "feedback"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.feedback import signals  # noqa: F401 - connects the receivers
