from django.apps import AppConfig


class FeedbackConfig(AppConfig):
    name = "apps.feedback"
    label = "feedback"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # signals connects the receivers; services registers the built-in kinds' services.
        from apps.feedback import services, signals  # noqa: F401
        from apps.feedback.kinds import kinds_load

        # Every kind registered at start.
        kinds_load()
