from django.apps import AppConfig

from apps.buffer.flags import flagging_kinds_source  # Django-free: safe before the models load


class FeedbackConfig(AppConfig):
    name = "apps.feedback"
    label = "feedback"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # app loading: apps.py loads before the models, ready() after them. signals connects
        # the receivers; the kinds' modules load models.
        from apps.feedback import signals  # noqa: F401
        from apps.feedback.kinds import kinds_load, kinds_that_flag

        # Every kind registered at start, with its service (each kind's module).
        kinds_load()
        # The buffer's pipeline, below this app, reads which kinds flag from the registry.
        flagging_kinds_source(kinds_that_flag)
