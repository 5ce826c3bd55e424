from django.apps import AppConfig


class ControlConfig(AppConfig):
    """The control plane over the run kernel (apps.runs): the RFT loop that conducts every
    running run, the run lifecycle that needs tasksets and rewards, the run pages and the
    `rft` commands. It owns no models: runs, versions and metrics live in apps.runs."""

    name = "apps.control"
    label = "control"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process that can end a run (web, workers, commands) loads the apps: each
        # queues the run's notifications when run_transition sends run_ended.
        # app loading: apps.py loads before the models, ready() after them.
        from apps.control.notifications import notifications_connect

        notifications_connect()
