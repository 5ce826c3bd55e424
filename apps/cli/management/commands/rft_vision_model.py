"""Build the local tiny vision-language model and its picture taskset (no model hub needed):
apps/cli/model_build.py."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from apps.cli.model_build import ModelBuildCommand
from workers.models.vision_demo import BUILD


class Command(ModelBuildCommand):
    recipe = BUILD
    help = (
        "Build a tiny Idefics3-style vision-language model locally, warm it up on counting coloured squares, "
        "and save it with its taskset (vision-taskset.zip: tasks.jsonl and the pictures) to --out. Skipped when "
        "--out already holds a model built with the same settings."
    )

    def default_out(self) -> Path:
        return Path(settings.VAR_DIR) / "vision-model"
