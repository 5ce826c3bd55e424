"""Set up the demo that `make run` serves: the local demo model and its taskset, an owner
account, an annotator account, and a draft GRPO run on the demo task. Idempotent."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.runs.demo import demo_taskset_import
from apps.runs.models import Run, RunMember
from apps.runs.services import run_create
from rftweb.exceptions import RftError, command_error

DEMO_RUN = "demo: GRPO on arithmetic"


def demo_config(*, total_steps: int = 40) -> dict[str, Any]:
    return {
        "model": str(settings.RFT_DEMO_MODEL_DIR),
        "algorithm": "grpo",
        "mode": "async",
        "max_staleness": 1,
        "engine": "transformers",
        "repeat_times": 8,
        "explore_batch_size": 8,
        "train_batch_size": 64,
        "total_steps": total_steps,
        "epochs": 20,
        "sampling": {"temperature": 1.0, "max_tokens": 12},
        "rewards": [{"name": "math_accuracy"}, {"name": "math_format", "weight": 0.1}],
        "trainer": {"learning_rate": 5e-4, "loss_type": "dapo"},
        # People's ratings teach a reward model on the reward queue (from the demo model itself);
        # switch feedback.mode to learned on the run page to train on it.
        "reward_model": {"enabled": True, "base": "policy", "retrain_every": 20, "max_length": 64},
    }


class Command(BaseCommand):
    help = "Build the demo model and taskset and create demo accounts and a demo run (idempotent)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--password", default=os.environ.get("RFT_DEMO_PASSWORD", "rftweb-demo"),
                            help="password of the demo accounts (default rftweb-demo, or RFT_DEMO_PASSWORD)")
        parser.add_argument("--total-steps", type=int, default=40, help="trainer steps of the demo run")

    def handle(self, *args: Any, password: str, total_steps: int, **options: Any) -> None:
        if total_steps < 1:
            raise CommandError("--total-steps must be at least 1")
        if not settings.DEBUG:
            raise CommandError("rft_demo creates accounts with a known password: run it with DEBUG on only")
        call_command("rft_demo_model", stdout=self.stdout, stderr=self.stderr)
        with transaction.atomic():
            owner = self._user("owner", password, staff=True)
            annotator = self._user("annotator", password, staff=False)
            run = Run.objects.filter(name=DEMO_RUN, owner=owner).first()
            if run is None:
                try:
                    taskset = demo_taskset_import(owner=owner)
                except RftError as exc:
                    raise command_error(exc) from None
                run = run_create(name=DEMO_RUN, owner=owner, config=demo_config(total_steps=total_steps), taskset=taskset)
                RunMember.objects.get_or_create(run=run, user=annotator, defaults={"role": RunMember.Role.ANNOTATOR})
        self.stdout.write(self.style.SUCCESS(
            f"demo ready: log in as owner / {password} (or annotator / {password}); "
            f"run #{run.pk} '{run.name}' is {run.status} — start it from its page"
        ))

    def _user(self, username: str, password: str, *, staff: bool) -> User:
        user, created = User.objects.get_or_create(username=username, defaults={"is_staff": staff, "is_superuser": staff})
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
        return user
