"""Build the local demo model and its taskset (no model hub needed): apps/cli/model_build.py."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from apps.cli.model_build import ModelBuildCommand
from workers.models.demo import BUILD


class Command(ModelBuildCommand):
    recipe = BUILD
    help = (
        "Train a tokenizer and a small Qwen2 model locally, warm it up on integer arithmetic with "
        "<answer> tags, and save it (with a demo taskset) to --out. Skipped when --out already holds "
        "a model built with the same settings."
    )

    def default_out(self) -> Path:
        return Path(settings.RFT_DEMO_MODEL_DIR)
