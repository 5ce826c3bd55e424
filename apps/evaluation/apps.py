from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "apps.evaluation"
    label = "evaluation"
    default_auto_field = "django.db.models.BigAutoField"
    # The annotation page hands out this app's blind pairs between its items, and the person's
    # "your submissions" counts their votes as not trained: apps/feedback/extras.py loads these
    # by name from every installed app's config (feedback imports nothing of this app).
    annotation_cards = "apps.evaluation.between.BLIND_CARDS"
    annotation_not_trained = "apps.evaluation.between.votes_not_trained"
