from django.apps import AppConfig


class BufferConfig(AppConfig):
    name = "apps.buffer"
    label = "buffer"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The run config (apps.runs, below this app) validates its pipeline steps through the
        # kernel's vocabulary registry.
        from apps.buffer.pipeline.registry import operator_names, params_check, stage_check
        from kernel.vocabulary import operators_register

        operators_register(names=operator_names, params_check=params_check, stage_check=stage_check)
