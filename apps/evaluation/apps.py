from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "apps.evaluation"
    label = "evaluation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The annotation page hands out blind pairs between its items and the person's ledger
        # counts their votes, through apps.feedback's registry: feedback imports nothing of this app.
        from apps.evaluation.between import BlindCards, votes_not_trained
        from apps.feedback.extras import card_source_register, not_trained_register

        card_source_register("blind evaluation", BlindCards())
        not_trained_register("blind evaluation", votes_not_trained)
