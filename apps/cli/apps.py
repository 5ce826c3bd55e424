from django.apps import AppConfig


class CliConfig(AppConfig):
    """The command line: `rft` (runs, tasksets, feedback, exports, workers), `rft_demo`,
    `rft_serve` and the demo models' builders. At the top of the apps' layers, above workers/:
    some commands run worker code in this process (a model's or a reward model's export,
    building the demo and vision models), and workers/ imports the control plane below."""

    name = "apps.cli"
    label = "cli"
    default_auto_field = "django.db.models.BigAutoField"
