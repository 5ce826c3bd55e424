"""How many of a person's labels arrive in time (before their group trains), on a demo-like run,
with the queue and holds of issue #31 against the queue of before, in the same run.

The run is the demo's shape (`rft_demo`: groups of 8, 8 groups an explore step, a batch of 64,
blend, a 20 s wait window, async, one step of staleness); the explorer, the trainer and the
person are simulated on a simulated clock (every service reads django.utils.timezone.now, which
the bench moves), through the real services on Postgres: the explorer writes a step of pending
groups every `--step-seconds`, the trainer claims a whole-group batch of 64 whenever one is
claimable and holds it `--train-seconds` before acknowledging it, the wait windows' beat runs
every second, and the person works down their queue (8 items, in order) at one rating per
`--rate-seconds` (a person ranking 8 answers needs longer than the 20 s window), topping it up
after each rating and when a step arrives, their page polling the header every 10 s.

Arms (the same seeds, the same simulated time):
- `before`: the queue of before (groups waiting for people first, oldest first; leased items in
  hand-out order, each filling the queue) and no holds (feedback.hold_seconds 0), as the demo
  ran when 12 of 13 labels arrived late;
- `fresh`: the new queue alone (freshest first, items whose group trained after the rest and
  not filling it), holds off;
- `holds`: holds alone (oldest first);
- `after`: both (the defaults: hold 45 s, cap 180 s).

Prints, per arm, the share of labels that arrived in time (median over seeds and the spread),
the train steps done in the same time (what holds cost the trainer) and the load average; the
last line is the ratio after / before of the in-time share.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from bench.common import setup_django, wait_windows_end

ARMS = ("before", "fresh", "holds", "after")


class Clock:
    def __init__(self) -> None:
        from django.utils import timezone

        self.at: datetime = timezone.now()

    def now(self) -> datetime:
        return self.at


@contextmanager
def simulated(clock: Clock) -> Iterator[None]:
    from django.utils import timezone

    real = timezone.now
    timezone.now = clock.now
    try:
        yield
    finally:
        timezone.now = real


@contextmanager
def oldest_first() -> Iterator[None]:
    """The queue of before this issue: groups waiting for people first, oldest first; the
    person's leased items in hand-out order, every one of them filling the queue's size."""
    from django.db.models import Q

    from apps.feedback.handout import lease, queue, rule

    # The claim reads its candidates through rule.annotation_handout (the waiting count's too).
    real: Callable[..., Any] = rule.annotation_candidates
    real_queue: Callable[..., Any] = queue.annotation_queue
    real_counts: Callable[..., Any] = queue.queue_item_counts  # what lease imported

    def queue_before(*, run: Any, annotator: Any) -> Any:
        return real_queue(run=run, annotator=annotator).order_by("id")

    def before(*, run: Any, annotator: Any) -> Any:
        from django.db.models import Case, IntegerField, Value, When

        waiting = Case(When(status="pending", then=Value(0)), default=Value(1), output_field=IntegerField())
        return real(run=run, annotator=annotator).order_by(waiting, "id")

    rule.annotation_candidates = before
    queue.annotation_queue = queue_before
    setattr(lease, "queue_item_counts", Q)  # every leased item fills the queue (lease's own name)
    try:
        yield
    finally:
        rule.annotation_candidates = real
        queue.annotation_queue = real_queue
        setattr(lease, "queue_item_counts", real_counts)


def simulate(*, arm: str, seed: int, steps: int, step_seconds: float, train_seconds: float, rate_seconds: float,
             wait: float) -> dict[str, float]:
    from django.contrib.auth.models import User

    from apps.buffer.drafts import ExperienceDraft
    from apps.buffer.models import Experience
    from apps.buffer.selectors import experiences_claimable, experiences_in_whole_groups
    from apps.buffer.services import batch_ack, batch_claim, experience_write
    from apps.feedback.handout.holds import holds_renew
    from apps.feedback.models import Feedback
    from apps.feedback.handout import queue
    from apps.feedback.handout.lease import assignment_claim
    from apps.feedback.kinds.rating import feedback_rate
    from apps.runs.models import RunMember
    from apps.runs.services import run_create

    rng = random.Random(seed)
    hold = arm in ("holds", "after")
    owner, _ = User.objects.get_or_create(username="bench-owner")
    person, _ = User.objects.get_or_create(username="bench-person")
    config = {
        "model": "local/demo", "algorithm": "grpo", "mode": "async", "max_staleness": 1, "repeat_times": 8,
        "explore_batch_size": 8, "train_batch_size": 64, "total_steps": steps, "seed": seed,
        "rewards": [{"name": "math_accuracy"}],
        "feedback": {"mode": "blend", "w_auto": 0.5, "w_human": 0.5, "wait_seconds": wait, "fallback": "auto",
                     **({} if hold else {"hold_seconds": 0})},
    }
    clock = Clock()
    with simulated(clock), (oldest_first() if arm in ("before", "holds") else _nothing()):
        run = run_create(name=f"label-timing {arm} {seed}", owner=owner, config=config)
        RunMember.objects.create(run=run, user=person, role=RunMember.Role.ANNOTATOR)
        t, next_step, explored, trained = 0.0, 0.0, 0, 0
        training: tuple[float, list[int]] | None = None
        next_action, next_poll = 0.0, 10.0
        end = steps * step_seconds
        while t < end:
            if t >= next_step and explored < steps:
                rows = [ExperienceDraft.from_row({
                    "run_id": run.pk, "key": f"s{explored}-g{g}-{i}", "group_id": f"s{explored}-g{g}",
                    "prompt_text": f"What is {explored} + {g}?", "response_text": f"<answer>{rng.randint(0, 20)}</answer>",
                    "token_ids": [1, 2, 3, 4], "prompt_length": 2, "status": "pending", "reward": None,
                    "auto_reward": float(rng.random() < 0.5), "model_version": trained,
                }) for g in range(8) for i in range(8)]
                experience_write(experiences=rows)
                explored += 1
                next_step += step_seconds
                assignment_claim(run=run, annotator=person, size=8)  # the page tops up on new rollouts
            wait_windows_end(run_ids=[run.pk], now=clock.at)  # this bench's run's alone
            if training is not None and t >= training[0]:
                batch_ack(run=run, worker="trainer", ids=training[1])
                trained += 1
                training = None
            if training is None:
                whole = experiences_in_whole_groups(run=run, qs=experiences_claimable(run=run, now=clock.at,
                                                                                      expert=False))
                if whole.count() >= 64:
                    batch = batch_claim(run=run, worker="trainer", size=64, group_complete=True, expert=False)
                    training = (t + train_seconds, [e.pk for e in batch])
            if t >= next_action:
                item = next(iter(queue.annotation_queue(run=run, annotator=person)), None)
                if item is None:
                    assignment_claim(run=run, annotator=person, size=8)
                    next_action = t + 1.0
                else:
                    feedback_rate(run=run, experience=item.experience_id, score=rng.randint(1, 5), author=person)
                    assignment_claim(run=run, annotator=person, size=8)
                    next_action = t + rng.uniform(0.5, 1.5) * rate_seconds
            if t >= next_poll:
                holds_renew(run=run, annotator=person)  # the header's poll
                next_poll += 10.0
            t += 1.0
            clock.at += timedelta(seconds=1.0)
        labels = Feedback.objects.filter(run=run, kind="rating")
        total = labels.count()
        in_time = labels.filter(late=False).count()
        Experience.objects.filter(run=run).delete()
    return {"labels": float(total), "in_time": in_time / total if total else float("nan"), "steps": float(trained)}


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30, help="explore steps of the simulated run")
    parser.add_argument("--step-seconds", type=float, default=8.0, help="simulated seconds between explore steps")
    parser.add_argument("--train-seconds", type=float, default=6.0, help="simulated seconds a train step takes")
    parser.add_argument("--rate-seconds", type=float, default=4.0, help="simulated seconds a person takes per rating")
    parser.add_argument("--wait", type=float, default=20.0, help="feedback.wait_seconds (the demo's 20 s)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    args = parser.parse_args()
    setup_django()
    import logging

    logging.getLogger("apps.feedback.handout.expiry").setLevel(logging.WARNING)  # a line per wait window

    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            results[arm].append(simulate(arm=arm, seed=seed, steps=args.steps, step_seconds=args.step_seconds,
                                         train_seconds=args.train_seconds, rate_seconds=args.rate_seconds,
                                         wait=args.wait))
    load = os.getloadavg()[0]
    print(f"label_timing: demo-like run, {args.steps} explore steps of 64 every {args.step_seconds:g} s, a rating "
          f"every ~{args.rate_seconds:g} s, wait {args.wait:g} s, seeds {args.seeds} (simulated clock)")
    medians: dict[str, float] = {}
    for arm, rows in results.items():
        shares = [r["in_time"] for r in rows]
        medians[arm] = statistics.median(shares)
        print(f"  {arm:7s} in time {medians[arm]:.3f} (min {min(shares):.3f}, max {max(shares):.3f}) of "
              f"{statistics.median(r['labels'] for r in rows):.0f} labels; train steps "
              f"{statistics.median(r['steps'] for r in rows):.0f}  (load {load:.2f})")
    if "before" in medians and "after" in medians:
        before = medians["before"]
        ratio = medians["after"] / before if before > 0 else float("inf")
        print(f"label_timing ratio (after / before share of labels in time): {ratio:.2f} "
              f"({medians['after']:.3f} vs {before:.3f}, load {load:.2f})")


if __name__ == "__main__":
    main()
