"""Set up the demo that `make run` serves: the local demo model and its taskset, an owner
account, an annotator account, and a draft GRPO run on the demo task. Idempotent."""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from apps.buffer.importers import taskset_create
from apps.buffer.models import Task
from apps.control.demo import demo_taskset_import
from apps.control.twins import run_twin_create
from apps.rewards.k12_taskset import k12_records
from apps.runs.models import Run, RunMember
from apps.runs.services import run_create
from kernel.eval_series import basis_words
from kernel.exceptions import RftError
from rftweb.exceptions import command_error

DEMO_RUN = "demo: GRPO on arithmetic"
# The demo run's length in train steps (`--total-steps`): bench/live_steering and bench/demo_teach
# measure runs of this length, the run `make run` starts.
DEMO_TOTAL_STEPS = 40
K12_RUN = "demo: K-12 short answers"


def demo_config(*, total_steps: int = DEMO_TOTAL_STEPS, feedback_wait: float = 20.0, eval_taskset: int | None = None) -> dict[str, object]:
    """The demo run: GRPO on arithmetic, its automatic reward the answer's correctness, and
    people teaching what that reward does not know (the guidelines' preference: the working
    shown before the answer). With `eval_taskset` (the demo's held-out problems), every second
    version is evaluated and the run page charts the share of held-out answers each style
    preference likes, beside the accuracy: measured, never rewarded."""
    config: dict[str, object] = {
        "model": str(settings.RFT_DEMO_MODEL_DIR),
        "algorithm": "grpo",
        # Sync, the product's default: each explore step samples the newest version. Async
        # (explore one version ahead) raised the twin's held-out arithmetic less (see trainer).
        "mode": "sync",
        "engine": "transformers",
        "repeat_times": 8,
        "explore_batch_size": 8,
        "train_batch_size": 64,
        "total_steps": total_steps,
        "epochs": 20,
        # Room for the demo model's longer styles ("12 + 34 = 46, so <answer>46</answer>" is
        # about 25 tokens): a style cut off before its tag would score 0 and be trained away.
        "sampling": {"temperature": 1.0, "max_tokens": 32},
        "rewards": [{"name": "math_accuracy"}, {"name": "math_format", "weight": 0.1}],
        # A KL penalty toward the demo model: once people stop labelling, the reward model they
        # taught is frozen, and a policy free to wander finds answers unlike any it was taught
        # on that it scores top (bench/demo_teach, 2026-11-26: at KL 0 answers the guidelines
        # rate 1 scored above the liked ones by step 15, and the taught share fell back); the
        # penalty keeps the run near what was labelled. Learning rate 1e-4 (2e-4 to 5e-4 lowered
        # the held-out arithmetic the automatic reward pays for, in every form tried), sync mode.
        # The loss `dapo` and KL 0.3 (were `grpo` and 0.6 until round 68, issue 62 item 5): on
        # six seeds of bench/demo_teach the people run's held-out arithmetic ends level with its
        # start (+0.004 on the median, where the old settings left it 0.007 below), its twin's
        # rises on every seed (+0.016), and people teach the style half as far again (+0.58 beyond
        # the twin against +0.375). On a second build (round 69), nothing chosen on it, the people
        # run rose on every seed (+0.043 on the median; old settings +0.021), the twin +0.024, the
        # gain beyond it +0.516.
        # Every reading, and the screens beside it, in bench/README.md (rounds 68 and 69).
        "trainer": {"learning_rate": 1e-4, "params": {"loss_type": "dapo", "beta": 0.3}},
        # learned: people's ratings are folded where they rated (as blend), and the reward
        # model they teach (over the demo model itself, on the reward queue) scores what nobody
        # rated once its held-out accuracy is good enough. A group waits a short while for a
        # rating, then trains on the automatic reward alone, so the demo also runs with nobody
        # rating.
        "feedback": {"mode": "learned", "w_auto": 0.5, "w_human": 0.5, "w_rm": 0.5, "wait_seconds": feedback_wait,
                     "fallback": "auto", "guidelines": DEMO_GUIDELINES},
        "reward_model": {"enabled": True, "base": "policy", "retrain_every": 20, "max_length": 64},
    }
    if eval_taskset is not None:
        config["eval_every"] = 2
        # Sampled as in training (a seeded draw, two answers a problem): a style the model writes
        # some of the time shows as a share that moves, where greedy answers flip all at once.
        config["eval"] = {"taskset": eval_taskset, "max_tasks": 64, "n": 2,
                          "sampling": {"temperature": 1.0, "max_tokens": 32, "seed": 0},
                          "preferences": [DEMO_PREFERENCE, "in_words", "concise"]}
    return config


# The style the demo's guidelines ask people for (kernel/preferences.py): the run page
# charts its share of held-out answers. The demo model writes it in about one answer in four
# (workers/models/demo.py: a quarter of its warm-up; 0.24 of held-out samples), so there is something to amplify;
# bench/steering measured it the most teachable of the three with few labels (`working`: rm10
# 0.92-1.05x of `all`'s gain with 0.094x its labels on this model, 3 seeds, its form as
# accurate as the bare answer).
DEMO_PREFERENCE = "working"

DEMO_GUIDELINES = """\
**Rate one thing the automatic reward does not know: is the working shown before the answer?**

- 5: the calculation comes first, then the answer (`12 + 34 = 46, so <answer>46</answer>`)
- 3: words before the answer, or the calculation after it
- 1: the answer alone

Whether the number is right is the automatic reward's business, not yours.
Use *skip* when you cannot tell.
"""


def k12_demo_config(*, total_steps: int = DEMO_TOTAL_STEPS, feedback_wait: float = 20.0) -> dict[str, object]:
    """GRPO on the shipped K-12 taskset, scored half by the reference-guided judge and half by
    the learned grader trained on the taskset's graded answers and people's ratings. The judge
    is the run's own model: the demo model's 256-token context cannot hold the judge's prompt,
    so its verdicts are 0 with that reason (set params.model to a local instruction model with
    a longer context to see real ones); the learned grader's part carries the signal."""
    return {
        **demo_config(total_steps=total_steps, feedback_wait=feedback_wait),
        # Async as before (issue 62 item 5 measured the arithmetic demo's mode only).
        "mode": "async", "max_staleness": 1,
        "feedback": {"mode": "blend", "w_auto": 0.5, "w_human": 0.5, "wait_seconds": feedback_wait, "fallback": "auto",
                     "guidelines": K12_GUIDELINES},
        "sampling": {"temperature": 1.0, "max_tokens": 24},
        "rewards": [{"name": "k12_judge", "weight": 0.5, "domains": ["k12"], "params": {"max_tokens": 24}},
                    {"name": "k12_learned", "weight": 0.5, "domains": ["k12"], "params": {"max_length": 192}}],
    }


K12_GUIDELINES = """\
**Grade the student's answer against the question** (the reference answer is in the task).

- 5: right (other words are fine)
- 3: partly right or incomplete
- 1: wrong, off-topic or empty

Your grades teach the learned K-12 grader.
"""


class Command(BaseCommand):
    help = "Build the demo model and taskset and create demo accounts and a demo run (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", default=settings.RFT_DEMO_PASSWORD,
                            help="password of the demo accounts (default rftweb-demo, or RFT_DEMO_PASSWORD)")
        parser.add_argument("--total-steps", type=int, default=DEMO_TOTAL_STEPS, help="trainer steps of the demo run")
        parser.add_argument("--feedback-wait", type=float, default=20.0,
                            help="seconds a group waits for a person's rating before it trains on the automatic reward")
        parser.add_argument("--k12", action="store_true",
                            help="also create a draft run on the shipped K-12 short-answer taskset (K-12 graders)")

    def handle(self, *args: object, password: str, total_steps: int, feedback_wait: float, k12: bool = False,
               **options: object) -> None:
        if total_steps < 1:
            raise CommandError("--total-steps must be at least 1")
        if feedback_wait < 0:
            raise CommandError("--feedback-wait must be 0 or more seconds")
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
                    heldout = demo_taskset_import(owner=owner, name="demo arithmetic (held out)", heldout=True)
                except RftError as exc:
                    raise command_error(exc) from None
                config = demo_config(total_steps=total_steps, feedback_wait=feedback_wait, eval_taskset=heldout.pk)
                run = run_create(name=DEMO_RUN, owner=owner, config=config, taskset=taskset)
                RunMember.objects.get_or_create(run=run, user=annotator, defaults={"role": RunMember.Role.ANNOTATOR})
            if run.status == Run.Status.DRAFT and not Run.objects.filter(twin_of=run).exists():
                # Its twin, without people: it starts when the demo run starts, so both run pages
                # show what people taught beside what the automatic reward alone did.
                run_twin_create(run=run, actor=owner)
            if k12 and not Run.objects.filter(name=K12_RUN, owner=owner).exists():

                records: list[Mapping[str, object]] = list(k12_records())
                taskset = taskset_create(name="K-12 short answers", records=records, owner=owner)
                k12_run = run_create(name=K12_RUN, owner=owner, taskset=taskset,
                                     config=k12_demo_config(total_steps=total_steps, feedback_wait=feedback_wait))
                RunMember.objects.get_or_create(run=k12_run, user=annotator, defaults={"role": RunMember.Role.ANNOTATOR})
        self.stdout.write(self.style.SUCCESS(
            f"demo ready: log in as owner / {password}; run #{run.pk} '{run.name}' is {run.status} — start it from "
            f"its page. Its feedback mode is learned: people's ratings, and the reward model they teach, change "
            f"training. Open /runs/{run.pk}/annotate/ as annotator / {password} in a second (private) window and "
            f"rate by the guidelines' preference (the working shown before the answer); the run page charts its "
            f"share of held-out answers. {self._twin_line(run)}"
        ))
        if line := self._eval_line(run):
            self.stdout.write(line)
        if k12:
            k12_run = Run.objects.get(name=K12_RUN, owner__username="owner")
            self.stdout.write(self.style.SUCCESS(
                f"K-12 demo: run #{k12_run.pk} '{k12_run.name}' ({k12_run.status}) on the shipped K-12 taskset, "
                "scored by the K-12 judge and the learned K-12 grader."
            ))

    @staticmethod
    def _eval_line(run: Run) -> str:
        """What the run page's held-out figures will count, beside the build's line above
        (greedy, every held-out problem): the two measure differently, so both say how."""
        ev = run.cfg.eval
        if ev.taskset is None:
            return ""
        held_out = Task.objects.filter(taskset_id=ev.taskset).count()
        tasks = min(ev.max_tasks, held_out)
        return (f"run page's held-out figures: {basis_words(tasks=tasks, samples=ev.n, temperature=ev.sampling.temperature)}"
                f" (the first {tasks} of the {held_out} held-out problems; the build's figure above is greedy on all {held_out})")

    @staticmethod
    def _twin_line(run: Run) -> str:
        twin = Run.objects.filter(twin_of=run).order_by("-created_at").first()
        if twin is None:
            return ""
        return (f"Its twin, run #{twin.pk} '{twin.name}' ({twin.status}), is the same run with people's feedback off; "
                "it starts with the demo run, and both run pages show people's effect beside it.")

    def _user(self, username: str, password: str, *, staff: bool) -> User:
        user, created = User.objects.get_or_create(username=username, defaults={"is_staff": staff, "is_superuser": staff})
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
        return user
