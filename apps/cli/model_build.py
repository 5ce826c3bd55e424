"""The one command behind `rft_demo_model` and `rft_vision_model`: build a model made
locally (a recipe of workers/models/build.py) and its taskset, or say it is up to date.

The recipes' modules load no torch (they import it inside their build), so the web side may
load these commands (Django lists them) without the heavy extras.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.models.build import Recipe, model_build


class ModelBuildCommand(BaseCommand):
    recipe: ClassVar[Recipe[Any]]

    def default_out(self) -> Path:
        raise NotImplementedError

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default=None, help=f"output directory (default {self.default_out()})")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--steps", type=int, default=None, help="warm-up SFT steps (at most)")
        parser.add_argument("--force", action="store_true", help="rebuild even if the directory is up to date")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        name = self.recipe.name
        out = Path(options["out"] or self.default_out())
        if out.exists() and not out.is_dir():
            raise CommandError(f"{out} exists and is not a directory")
        if options["steps"] is not None and options["steps"] < 1:
            raise CommandError("--steps must be at least 1")
        overrides: dict[str, Any] = {"seed": options["seed"]}
        if options["steps"] is not None:
            overrides["steps"] = options["steps"]
        result = model_build(self.recipe, out=out, settings=self.recipe.settings_type(**overrides),
                             force=options["force"], progress=not options["quiet"],
                             log=lambda line: self.stdout.write(line))
        taskset = f"taskset: {out / self.recipe.taskset}"
        if result.built:
            self.stdout.write(self.style.SUCCESS(
                f"{name} saved to {out} in {result.seconds:.0f} s; held-out greedy accuracy {result.accuracy:.1%}; {taskset}"))
        else:
            self.stdout.write(f"{name} in {out} is up to date (held-out greedy accuracy {result.accuracy:.1%}); {taskset}")
