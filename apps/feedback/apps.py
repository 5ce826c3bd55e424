from django.apps import AppConfig


class FeedbackConfig(AppConfig):
    name = "apps.feedback"
    label = "feedback"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # signals connects the receivers.
        # app loading: apps.py loads before the models, ready() after them.
        from apps.feedback import signals  # noqa: F401
        # app loading: apps.py loads before the models, ready() after them.
        from apps.feedback.kinds import kinds_load

        # Every kind registered at start, with its service (each kind's module).
        kinds_load()
