from django.apps import AppConfig


class ControlConfig(AppConfig):
    """The control plane over the run kernel (apps.runs): the RFT loop that conducts every
    running run, the run lifecycle that needs tasksets and rewards, the run pages and the
    `rft` commands. It owns no models: runs, versions and metrics live in apps.runs."""

    name = "apps.control"
    label = "control"
    default_auto_field = "django.db.models.BigAutoField"
