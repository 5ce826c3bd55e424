from django.apps import AppConfig


class RewardsConfig(AppConfig):
    name = "apps.rewards"
    label = "rewards"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.rewards import signals  # noqa: F401 - connects the receivers
