"""One arm on one seed (`run_arm`): a run made of the arm's config, explored, rated by scripted
people through the annotation page, its reward model trained and its wait windows ended by the
bench, and trained, step by step in this process; then its final model measured."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import wait_windows_end
from bench.raters import Rating, correct
from bench.steering.config import RM_GATE_DEFAULT, arm_config
from bench.steering.measurement import HELDOUT, StepProbe, held_out_accuracy, held_out_samples, probe_line, step_probe
from bench.steering.people import PASSWORD, Rater


def _gold_mark(owner: Rater, run: Any) -> int:
    """The owner marks a few explored completions as gold through the Raters page form."""
    from apps.buffer.models import Experience

    marked = 0
    for exp_id, prompt, response in (Experience.objects.filter(run=run, is_expert=False).order_by("id")
                                     .values_list("pk", "prompt_text", "response_text")[:12]):
        score = owner.score_for(prompt, response)
        r = owner.post(f"/runs/{run.pk}/signal/raters/", {"experience": str(exp_id), "score": str(score)})
        if r.status_code not in (200, 302):
            raise SystemExit(f"gold marking failed: {r.status_code}")
        marked += 1
    return marked


def run_arm(arm: str, *, url: str, seed: int, steps: int, tasks: int, repeat: int, lr: float, share: float,
            demo: Path, owner_user: Any, base_acc: tuple[float, float], rm_base: str | None = None,
            min_rm_accuracy: float = 0.75, scale_rewards: str = "batch", rm_kind: str = "head",
            min_rm_heldout_pairs: int = 0, rm_confidence: float = 0.95, w_auto: float = 0.2,
            crossval_folds: int = 4, pairs: bool = True, trust: bool = True, rating: Rating = correct,
            noise: float = 0.0, noisy_raters: int = 2, random_share: float = 0.5, max_tokens: int = 32,
            verifier: bool = False, beta: float = 0.0, rm_gate: str = RM_GATE_DEFAULT, selection: str = "active",
            heldout: int = HELDOUT) -> dict[str, Any]:
    """One arm on one seed: the run's figures and its final model's held-out samples
    (`samples`, rated by each rater afterwards: `measurement.measured`); a `learned` arm's step probes."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from apps.buffer.importers import taskset_import
    from apps.buffer.models import Experience
    from apps.buffer.services import task_attempts_create
    from apps.feedback.models import Feedback
    from apps.feedback.reward_model.versions import reward_model_usable
    from apps.rewards.models import RewardModel
    from apps.runs.models import Metric, ModelVersion, Run, RunMember
    from apps.runs.ports import run_view_of
    from apps.runs.services import run_create
    from workers.models.demo import TASKSET_FILE
    from workers.explore.explorer import explore
    from workers.reward.trainer import reward_model_score_run, reward_model_train_run
    from workers.trainer.step import trainer_step

    taskset = taskset_import(name=f"steering {arm} {seed}", path=demo / TASKSET_FILE, owner=owner_user)
    run = run_create(name=f"steering {arm} s{seed}", owner=owner_user, taskset=taskset,
                     config=arm_config(arm, model=str(demo), steps=steps, tasks=tasks, repeat=repeat, seed=seed, lr=lr,
                                    rm_base=rm_base, min_rm_accuracy=min_rm_accuracy, scale_rewards=scale_rewards,
                                    rm_kind=rm_kind, min_rm_heldout_pairs=min_rm_heldout_pairs,
                                    rm_confidence=rm_confidence, w_auto=w_auto, crossval_folds=crossval_folds,
                                    pairs=pairs, trust=trust, max_tokens=max_tokens, verifier=verifier,
                                    beta=beta, rm_gate=rm_gate, selection=selection)[0])
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    for epoch in range(run.cfg.epochs):
        task_attempts_create(run=run, epoch=epoch)
    # noisy: `noisy_raters` people, `random_share` of them (at least one careful) answering at
    # random, the careless ones last (the turns at the page rotate by step).
    count = max(2, noisy_raters) if arm == "noisy" else 1
    careless = min(count - 1, round(random_share * count)) if arm == "noisy" else 0
    names = [f"r{run.pk}{chr(ord('a') + i)}" for i in range(count)]
    for name in names:
        RunMember.objects.create(run=run, user=User.objects.create_user(username=name, password=PASSWORD),
                                 role=RunMember.Role.ANNOTATOR)
    raters = [Rater(url, name, careful=i < count - careless, seed=seed * 100 + i, rating=rating, noise=noise)
              for i, name in enumerate(names)]
    owner = Rater(url, owner_user.username, careful=True, seed=seed, rating=rating)
    rm_seconds = 0.0
    usable_from: int | None = None
    probes: list[StepProbe] = []
    last_assignment = 0
    started = time.perf_counter()
    for step in range(1, steps + 1):
        summary = explore(run_id=run.pk, step=step, worker="bench-explorer")
        if not summary.get("tasks"):
            raise SystemExit(f"{arm}: explore step {step} found no tasks: {summary}")
        if arm == "noisy" and step == 1:
            _gold_mark(owner, run)
        rollouts = tasks * repeat
        if run.cfg.reward_model.enabled:
            # The newest version scores the new rollouts before people see them, as the
            # reward beat does in a deployment: the selection rule ranks by those scores.
            t = time.perf_counter()
            reward_model_score_run(run=run_view_of(run))
            rm_seconds += time.perf_counter() - t
        if arm in ("auto", "format"):
            pass
        elif arm == "all":
            for r in raters:
                r.rate(run.pk, None)
        else:
            # The step's budget is the people's time: the raters take turns at the page (who
            # comes first alternates by step) and each rates what the server hands them until
            # the budget is spent. How much each one gets is the server's hand-out (the
            # selection rule, and `feedback.trust` by measured trust), not a split by the bench,
            # which does not know who answers at random. Two raters both handed items share the
            # budget about evenly over the steps, as round 9's blind 4 / 2 split did.
            left = max(1, round(share * rollouts))
            turn = raters[step % len(raters):] + raters[:step % len(raters)]
            while left > 0:
                got = 0
                for r in turn:
                    if left > 0:
                        done = r.rate(run.pk, left)
                        left -= done
                        got += done
                if got == 0:
                    break  # nothing left to hand out to anyone
        if run.cfg.reward_model.enabled:
            t = time.perf_counter()
            reward_model_train_run(run=run_view_of(run))
            reward_model_score_run(run=run_view_of(run))
            rm_seconds += time.perf_counter() - t
            if usable_from is None and reward_model_usable(run=run) is not None:
                usable_from = step
        # The wait window ends after the raters' turn (the fallback: the format reward); this
        # arm's run's windows only, whatever else the database holds.
        wait_windows_end(run_ids=[run.pk], now=timezone.now() + timedelta(days=1))
        if run.cfg.feedback.mode == "learned":
            probe, last_assignment = step_probe(run, after_assignment=last_assignment)
            probes.append(probe)
        result = trainer_step(run_id=run.pk, step=step, worker="bench-trainer")
        if result.get("status") != "trained":
            raise SystemExit(f"{arm}: train step {step}: {result}")
        rm = RewardModel.objects.filter(run=run).order_by("-version").first()
        print(f"  {arm} s{seed} step {step:3d}  labels {Feedback.objects.filter(run=run, kind='rating').count():4d}"
              f"  rm {('v%d %.2f/%d' % (rm.version, rm.accuracy or 0, rm.pairs_heldout)) if rm else '-':>12}"
              f" random {_rm_random(rm):>9}"
              f"{'*' if usable_from else ' '}"
              f"  {time.perf_counter() - started:6.0f} s  load {os.getloadavg()[0]:.1f}"
              + (f"\n      {probe_line(probes[-1])}" if probes and len(probes) == step else ""), flush=True)
    checkpoint = ModelVersion.objects.get(run=run, train_step=steps).checkpoint
    acc, greedy = held_out_accuracy(checkpoint, demo, heldout)
    samples = held_out_samples(checkpoint, demo, max_tokens=max_tokens, seed=seed, heldout=heldout)
    rm = RewardModel.objects.filter(run=run).order_by("-version").first()
    labels = Feedback.objects.filter(run=run, kind="rating").count()
    skipped = Metric.objects.filter(run=run, name="train/skipped_no_signal", value=1.0).count()
    from apps.rewards.models import GoldItem

    gold_ids = set(GoldItem.objects.filter(run=run).values_list("experience_id", flat=True))
    # Where the budget went: each rater's labels, and how many of them were on gold items.
    by_rater = {(f"careful {r.username}" if r.careful else f"random {r.username}"): (
        Feedback.objects.filter(run=run, kind="rating", author__username=r.username).count(),
        Feedback.objects.filter(run=run, kind="rating", author__username=r.username,
                                experience_id__in=gold_ids).count()) for r in raters}
    return {"by_rater": by_rater, "usable_from": usable_from, "skipped": skipped,"arm": arm, "seed": seed, "acc": acc, "gain": acc - base_acc[0], "greedy": greedy,
            "greedy_gain": greedy - base_acc[1], "labels": labels,
            "rollouts": Experience.objects.filter(run=run, is_expert=False).count(),
            "rm_acc": rm.accuracy if rm else None, "rm_versions": rm.version if rm else 0,
            # The unbiased figure: accuracy on the pairs only the random share handed out.
            "rm_acc_random": rm.accuracy_random if rm else None, "rm_pairs_random": (rm.pairs_random or 0) if rm else 0,
            "rm_heldout": rm.pairs_heldout if rm else 0,
            "rm_pairs": 0 if rm is None else (
                rm.pairs_heldout if crossval_folds >= 2 else rm.pairs_train + rm.pairs_heldout),
            "samples": samples, "probes": probes,
            "seconds": time.perf_counter() - started, "rm_seconds": rm_seconds, "load": os.getloadavg()[0]}


def _rm_random(rm: Any) -> str:
    """A version's accuracy on the random share's pairs and their count, '-' when none."""
    if rm is None or rm.accuracy_random is None:
        return "-"
    return f"{rm.accuracy_random:.2f}/{rm.pairs_random}"
