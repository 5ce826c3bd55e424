from django.apps import AppConfig


class RewardsConfig(AppConfig):
    name = "apps.rewards"
    label = "rewards"
    default_auto_field = "django.db.models.BigAutoField"
