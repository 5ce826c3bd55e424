"""Build the local tiny vision-language model and its picture taskset (no model hub needed).

Torch is imported inside handle() only, through workers.vision_model: the web side may load
this module (Django lists commands) without the heavy extras.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Build a tiny Idefics3-style vision-language model locally, warm it up on counting coloured squares, "
        "and save it with its taskset (vision-taskset.zip: tasks.jsonl and the pictures) to --out. Skipped when "
        "--out already holds a model built with the same settings."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        default = Path(settings.VAR_DIR) / "vision-model"
        parser.add_argument("--out", default=str(default), help=f"output directory (default {default})")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--force", action="store_true", help="rebuild even if the directory is up to date")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from workers.vision_model import VisionSettings, vision_model_build
        except ImportError as exc:
            raise CommandError(f"building the vision model needs the worker extras (torch, transformers): {exc}") from None
        out = Path(options["out"])
        if out.exists() and not out.is_dir():
            raise CommandError(f"{out} exists and is not a directory")
        result = vision_model_build(out=out, settings=VisionSettings(seed=options["seed"]), force=options["force"],
                                    log=lambda line: self.stdout.write(line))
        state = f"saved to {out} in {result.seconds:.0f} s" if result.built else f"in {out} is up to date"
        self.stdout.write(f"vision model {state}; held-out greedy accuracy {result.accuracy:.1%}; "
                          f"taskset: {out / 'vision-taskset.zip'}")
