"""Build the local demo model and its taskset (no model hub needed).

Torch is imported inside handle() only, through workers.demo_model: the web side may load
this module (Django lists commands) without the heavy extras.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Train a tokenizer and a small Qwen2 model locally, warm it up on integer arithmetic with "
        "<answer> tags, and save it (with a demo taskset) to --out. Skipped when --out already holds "
        "a model built with the same settings."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default=None, help=f"output directory (default {settings.RFT_DEMO_MODEL_DIR})")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--steps", type=int, default=None, help="warm-up SFT steps")
        parser.add_argument("--force", action="store_true", help="rebuild even if the directory is up to date")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from workers.demo_model import DemoSettings, demo_model_build
        except ImportError as exc:
            raise CommandError(f"building the demo model needs the worker extras (torch, transformers): {exc}") from None

        out = Path(options["out"] or settings.RFT_DEMO_MODEL_DIR)
        if out.exists() and not out.is_dir():
            raise CommandError(f"{out} exists and is not a directory")
        if options["steps"] is not None and options["steps"] < 1:
            raise CommandError("--steps must be at least 1")
        overrides: dict[str, Any] = {"seed": options["seed"]}
        if options["steps"] is not None:
            overrides["steps"] = options["steps"]
        result = demo_model_build(
            out=out,
            settings=DemoSettings(**overrides),
            force=options["force"],
            progress=not options["quiet"],
            log=lambda line: self.stdout.write(line),
        )
        if result.built:
            self.stdout.write(
                self.style.SUCCESS(
                    f"demo model saved to {out} in {result.seconds:.0f} s; held-out greedy accuracy {result.accuracy:.1%}"
                )
            )
        else:
            self.stdout.write(f"demo model in {out} is up to date (held-out greedy accuracy {result.accuracy:.1%})")
