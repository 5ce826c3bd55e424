from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "apps.evaluation"
    label = "evaluation"
    default_auto_field = "django.db.models.BigAutoField"
