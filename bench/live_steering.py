"""Steering through the live loop at a person's pace (issue 62 item 2): how far a few people's
labels steer a run when the run is the product's own loop, as a user runs it, and the people
label at their own pace beside it.

The loop: the deployment's web server (docker-compose.yml's uvicorn command) and Celery workers
on a real broker (Redis), one a queue as `rft worker` plans them: the conductor (the `default`
queue, with Celery beat: the conductor beat, the wait windows' expiry, the reward-model beat),
the explorer (`rollout`), the trainer (`train`) and the reward model (`reward`, on its own queue,
trained and scoring while the explorer and trainer go on). Nothing of the loop runs in this
process; it only creates the runs, starts them as the Start button does (the people run and
its twin, `run_twin_create`: the same config with people's feedback and the reward model off,
started with it on the same workers), and reads the rows afterwards. The run's mode is the
config's default (sync, sync_interval 1).

The people: `--people` simulated annotators (two by default), each a person at the annotation
page of the people run (bench/steering's `Rater`: the login form, the page the hand-out fills,
its rating form's POST, CSRF and session cookie). They rate by a drawn preference nobody here
wrote (bench.raters.preference_family, `--raters generated:N --raters-start S`, or the drawn
seeds one by one, `--preferences 2,5,6`: styles, phrases,
lengths, and mixes of those with the right answer), with the preference's own noise. Their pace
is a person's: each label takes a reading time drawn around `--pace` seconds (log-normal,
sd 0.4 in log terms), a person who finds nothing waiting looks again after 2-6 s, and after any
label a person takes a break of 15-45 s with probability `--breaks` (scaled by `--pace` / 4).
A label arrives after its group trained whenever the loop outpaced the person (the label is then
late: stored, taught to the reward model, not folded). The team's budget: the people stop
labelling while the run's labels are 10% of its rollouts or more (`--budget`), and look again
later; a person who stops for now hands back what is left on their page (Skip), so its groups
are not held for them.

Per (preference, seed): the people run and its twin, the same steps; the preference's share
among 4 samples on each of `--heldout` held-out problems of each run's last version (the
measurement of bench/steering, off the clock), the base's share beside them; the gain beyond the
twin (people's share less the twin's: both start from the same base); the labels given and their
share of the rollouts; the late labels; the lag from a label to the first reward-model version
trained on a pair made from it (the ledger's LabelTaught rows) and to the first train step whose
rewards it changed (its own group's train step when it was folded, else the first train step that
trained on completions the reward model scored with that version or a newer one: "scored", not
"opened the gate": an approximation from above of the effect's lag), in train steps (median,
p90) and seconds; the sampled arithmetic against the twin. `--lab FILE` reads a bench/steering
results file (`--out`) of the same preferences, seeds and steps and prints the in-process
bench's gain beyond `format` (rm10's share gain less format's) beside each pair: the gap between
lab and loop as a number.

The run's config is the product's defaults (kernel.config: what the new-run form, the API and
the CLI give) but for the overrides printed at the start, each with its reason (`live_config`):
the task's (the demo model, its sizes, the steps, the seed, the format reward alone, `learned`
with its reward model), the demo model's own sampling, trainer and reward-model settings as
`rft_demo` gives every run of it (read from its `demo_config`). The wait window is the
product's: under `learned`, until the reward model passes its gate, a group nobody holds waits
`feedback.hold_seconds` (45 s), a group a person has open while their hold lasts
(apps.feedback.handout.expiry.wait_window; before round 64 every group waited the whole
`wait_seconds`, 600 s, and the bench set it to 30 s to run at all). `--wait S` still sets
`feedback.wait_seconds`, printed with its reason (WAIT_REASON). None of bench/steering's
training recipe (its `w_auto`, batch scaling, reward-model epochs and rate, gate) is taken.

`--concurrent K` runs K pairs at once on the one web server and set of workers (the product
serving several runs at once), each pair's people in threads of their own; a pair's line is
printed as it ends, and a pair whose runs did not finish is reported while the others go on.

Blind votes (issue #63 item 6, `--blind-votes N`, 0 for none; 20 by default: one task of
3 x N greedy answers on the rollout queue and some 2 x 3.3 N API calls, seconds beside a pair's
minutes): once a pair's runs end, the server still up, the owner's API key asks the REST API
for one blind evaluation of version 0 against the people run's last version and the twin's
(bench/blind, as bench/demo_teach asks it) on the first N held-out problems, the ones the share
is measured on (the runs have no evaluation taskset: the prompts go with the request). Three
voters (the owner and the pair's people, each with a key of their own) take the pairs in turn
and vote through the API by the pair's own drawn preference, the function its people label by
(without their noise: the share reads it so), seeing only the prompt and the two texts. Per
pair: each run's win rate over version 0 with its 95% interval, votes and verdict; its share
(the base's to its last version's) and the move; the direction check (a move above 0.1 must put
the win rate on the same side of 0.5; a smaller one checks nothing); the votes a ±0.1 interval
needs at the observed rate. The last line counts the runs checked and agreeing, and the median
votes needed. The answers are the run's evaluation sampling (greedy by default), the share's
are 4 samples at temperature 1: the two read the same versions differently.

    python -m bench.live_steering [--raters generated:2] [--raters-start 6 | --preferences 2,5,6] [--seeds 0]
                                  [--steps 40]
                                  [--people 2] [--pace 4] [--breaks 0.04] [--budget 0.1] [--wait S]
                                  [--heldout 200] [--minutes 40] [--lab FILE] [--concurrent 1] [--blind-votes 20]

Targets (issue 62, read on at least 6 preferences x 2 seeds): the gain beyond the twin at least
+0.15 on the median and +0.05 at the 25th percentile, positive on at least 80% of pairs, labels
at most 10% of rollouts, the label-to-effect lag's p90 at most 3 train steps, sampled arithmetic
within 0.02 of the twin on the median. The last lines print each against its target.

Measured 2026-11-28 on bench/steering's rm10 recipe (before the product's defaults), reduced
(3 preferences x seed 0 x 30 steps; bench/README.md): gain beyond
the twin +0.265 / +0.250 / +0.303, the in-process bench's +0.265 / +0.263 / +0.230 on the same
pairs, labels 0.095-0.098 of the rollouts, the label-to-effect lag 1 train step at the median and
p90 (17-18 s at the median), arithmetic -0.004 / -0.004 / -0.016 against the twin. On the
product's defaults (the same 3 pairs, run 3 at once): +0.278 / +0.205 / +0.125 beyond the twin,
the in-process bench's +0.241 / +0.253 / +0.177, labels 0.096-0.097 of the rollouts, the lag to
effect 1 train step at the median and p90, arithmetic +0.009 / -0.005 / -0.003.
Blind votes (2026-11-28, g2 g5 g6 g7 seed 0, the product's wait window, `--blind-votes 40`):
every people run's share moved +0.11..+0.29 and its v30 won over v0 at 0.69-0.79, each interval
above 0.5; the twins moved 0.03 or less and read even; ±0.1 needs 65-97 votes (bench/README.md).
Round 65 (one build of the demo model, the product's defaults, g2-g7 seeds 0 and 1): median gain
+0.222, 25th percentile +0.034 (g3, g4), 11 of 12 positive, arithmetic people - twin -0.004
(expected -0.002); `--wait 30` on seed 0 of the same build +0.009: the window costs none.
Round 66 (the same build, 40 steps: the demo run's own length, now the default): median gain
+0.271, 25th percentile +0.054 (g3 +0.059 / +0.039, g4 +0.018 / +0.034), 12 of 12 positive,
labels at most 0.098 of the rollouts, lag to effect p90 1 train step, arithmetic people - twin
-0.010 (expected -0.010): every target met, the 25th percentile by 0.004.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.blind import Arm, ArmVotes, blind_ask, blind_collect, blind_lines
from bench.common import BENCH_DB, DEMO_DIR, ROOT, bench_worker, compose_web_command, demo_model_identity, \
    exit_on_sigterm, free_port, health_wait, median, percentile, processes_stop, server_env, setup_django
from bench.raters import GeneratedRater, preference_draw, preference_family
from bench.steering import ITEM, PASSWORD, Override, Rater, Sampled, held_out_samples, samples_rated
from bench.steering.measurement import held_out_accuracy
from bench.steering.config import config_nested, size_overrides

if TYPE_CHECKING:
    from django.contrib.auth.models import User

TASKS, REPEAT = 8, 8
# Printed with `--wait` where it is given: the product's window is the default.
WAIT_REASON = ("--wait: the people run's wait window set by hand (by default the product's: under `learned`, "
               "until the reward model passes its gate, a group nobody holds waits feedback.hold_seconds)")


def leaves(prefix: str, value: object) -> list[tuple[str, object]]:
    """The (dotted path, value) of every leaf of a nested mapping."""
    if not isinstance(value, dict):
        return [(prefix, value)]
    return [leaf for key, child in value.items() for leaf in leaves(f"{prefix}.{key}" if prefix else str(key), child)]


def live_config(*, model: str, steps: int, seed: int,
                wait: float | None = None) -> tuple[dict[str, object], list[Override]]:
    """The people run's config and its overrides of the product's defaults (`config_validate`
    of a config naming only the model): the task's (the demo model and its sizes, the steps,
    the seed, the format reward alone, people steering through the reward model they teach),
    the demo model's own settings as `rft_demo` gives every run of it (its sampling, trainer
    and reward model, read from `demo_config`, not copied), and `wait` as the wait window
    where given (None: the product's). Nothing else differs from what a run gets by default."""
    from apps.cli.management.commands.rft_demo import DEMO_TOTAL_STEPS, demo_config
    from kernel.config import config_validate

    task = [
        Override("model", model, "the demo model (workers/models/demo), its styles at a minority share"),
        *size_overrides(tasks=TASKS, repeat=REPEAT, steps=steps, seed=seed, tasks_reason="8 problems",
                        repeat_reason="8 samples a problem, as bench/steering's pairs (the lab figures beside)",
                        steps_reason="the demo run's own length (rft_demo --total-steps)" if steps == DEMO_TOTAL_STEPS
                        else "--steps"),
        Override("rewards", [{"name": "math_format"}],
                 "the format reward alone: whatever the run learns of the preference it learns from people"),
        Override("feedback.mode", "learned", "people rate a few, the reward model they teach scores the rest"),
        Override("reward_model.enabled", True, "the reward model people teach (`learned`)"),
    ]
    defaults = dict(leaves("", config_validate(data={"model": model}).model_dump()))
    demo = demo_config(total_steps=steps)
    taken = {o.path for o in task}
    own = [Override(path, value, "the demo model's own setting, as rft_demo gives every run of it (demo_config)")
           for section in ("sampling", "trainer", "reward_model")
           for path, value in leaves(section, demo.get(section, {}))
           if path not in taken and defaults.get(path) != value]
    window = [] if wait is None else [Override("feedback.wait_seconds", wait, WAIT_REASON)]
    return config_nested([*task, *own, *window])


# ---------------------------------------------------------------- the people


@dataclass
class Pace:
    """How fast a person labels: a reading time around `seconds` a label, a look again after
    2-6 s when nothing waits, a break of 15-45 s (both scaled by seconds / 4) after a label with
    probability `breaks`, and the team's budget: no labels while the run's labels are `budget`
    of its rollouts or more."""

    seconds: float = 4.0
    breaks: float = 0.04
    budget: float = 0.1

    def scale(self) -> float:
        return self.seconds / 4.0


class Budget:
    """The team's label budget, shared by the people's threads: no label while the run's
    labels (with those being posted) are `share` of its rollouts or more."""

    def __init__(self, run_id: int, share: float) -> None:
        self.run_id, self.share = run_id, share
        self.lock = threading.Lock()
        self.posting = 0

    def counts(self) -> tuple[int, int]:
        from django.db import close_old_connections

        from apps.buffer.models import Experience
        from apps.feedback.models import Feedback

        close_old_connections()
        return (Feedback.objects.filter(run_id=self.run_id, kind="rating").count(),
                Experience.objects.filter(run_id=self.run_id, is_expert=False).count())

    def room(self) -> bool:
        labels, rollouts = self.counts()
        return labels + self.posting + 1 <= self.share * rollouts

    def take(self) -> bool:
        """Room for one more label: taken (call `done` once it is posted)."""
        with self.lock:
            if not self.room():
                return False
            self.posting += 1
            return True

    def done(self) -> None:
        with self.lock:
            self.posting -= 1


@dataclass
class Person:
    """One simulated annotator at the people run's annotation page, in a thread of its own."""

    rater: Rater
    run_id: int
    pace: Pace
    rng: random.Random
    stop: threading.Event
    budget: Budget
    given: int = 0
    breaks: int = 0
    errors: list[str] = field(default_factory=list)

    def wait(self, seconds: float) -> bool:
        """Sleep `seconds` unless told to stop; whether to go on."""
        return not self.stop.wait(max(0.0, seconds))

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.budget.room():
                    if not self.wait(self.rng.uniform(2, 6) * self.pace.scale()):
                        return
                    continue
                page = self.rater.get(f"/runs/{self.run_id}/annotate/")
                items = ITEM.findall(page.text) if page.status_code == 200 else []
                if not items:
                    if not self.wait(self.rng.uniform(2, 6) * self.pace.scale()):
                        return
                    continue
                self.items_rate(items)
        except Exception as exc:  # a person's thread ends with a line, not silently
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def items_rate(self, items: list[tuple[str, str, str, str, str]]) -> None:
        """Rate the page's items one by one at a person's pace, until the budget is reached."""
        for k, (_, assignment, _exp, prompt, completion) in enumerate(items):
            # Reading and deciding: log-normal around the pace.
            if not self.wait(self.pace.seconds * math.exp(self.rng.gauss(0.0, 0.4))):
                return
            if not self.budget.take():
                # Done for now: what is left on the page goes back (Skip), so that its groups
                # are not held for a person who has stopped (feedback.hold_seconds).
                for left in items[k:]:
                    self.rater.post(f"/runs/{self.run_id}/annotate/items/{left[1]}/skip/", {})
                return
            shown = html.unescape(re.sub(r"<[^>]+>", "", completion)).strip()
            score = self.rater.score_for(html.unescape(prompt), shown)
            try:
                r = self.rater.post(f"/runs/{self.run_id}/annotate/items/{assignment}/rate/", {"score": str(score)})
            finally:
                self.budget.done()
            if r.status_code == 200:
                self.given += 1
            elif r.status_code >= 500:
                self.errors.append(f"rating {assignment}: {r.status_code}")
            if self.rng.random() < self.pace.breaks:
                self.breaks += 1
                if not self.wait(self.rng.uniform(15, 45) * self.pace.scale()):
                    return


def people_start(*, url: str, run_id: int, names: list[str], preference: GeneratedRater, seed: int, pace: Pace,
                 stop: threading.Event) -> tuple[list[Person], list[threading.Thread]]:
    """Log each person in and start their thread at the people run's annotation page."""
    budget = Budget(run_id, pace.budget)
    people = [Person(rater=Rater(url, name, careful=True, seed=seed * 100 + i, rating=preference, noise=preference.noise),
                     run_id=run_id, pace=pace, rng=random.Random(seed * 1000 + i), stop=stop, budget=budget)
              for i, name in enumerate(names)]
    threads = [threading.Thread(target=p.loop, name=f"person-{p.rater.username}", daemon=True) for p in people]
    for t in threads:
        t.start()
    return people, threads


# ---------------------------------------------------------------- the loop's processes


def loop_start(*, env: dict[str, str], logs: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    """The deployment's web server and one Celery worker a queue (conductor with beat,
    explorer, trainer, reward model), all on the bench's database and broker; returns them
    and the server's URL once it answers and every worker answers a ping."""
    from rftweb.celery import app

    procs = [bench_worker("conductor", "default", [], env=env, logs=logs, beat=True),
             bench_worker("explorer", "rollout", ["workers.explore.explorer"], env=env, logs=logs),
             bench_worker("trainer", "train", ["workers.trainer"], env=env, logs=logs),
             bench_worker("reward", "reward", ["workers.reward.scoring", "workers.reward.trainer"], env=env, logs=logs)]
    port = free_port()
    procs.append(subprocess.Popen(compose_web_command(port=port, workers=1), cwd=ROOT, env=server_env(env),
                                  stdout=(logs / "web.log").open("wb"), stderr=subprocess.STDOUT))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    if not health_wait(url, seconds=300, alive=lambda: procs[-1].poll() is None):
        processes_stop(procs)
        raise SystemExit(f"the web server did not answer: {(logs / 'web.log').read_text()[-2000:]}")
    while time.monotonic() < deadline:
        if len(app.control.inspect(timeout=1.0).ping() or {}) >= 4:
            return procs, url
        if any(p.poll() is not None for p in procs):
            break
    processes_stop(procs)
    raise SystemExit(f"the Celery workers did not all answer (logs in {logs})")


# ---------------------------------------------------------------- one (preference, seed)


@dataclass
class PairResult:
    """One (preference, seed): the people run's and its twin's figures."""

    preference: str
    description: str
    mixed: bool
    seed: int
    base: Sampled
    people: Sampled
    twin: Sampled
    labels: int
    rollouts: int
    late: int
    breaks: int
    lags_rm: list[float]  # train steps from a label to the first reward-model version trained on it
    lags_effect: list[float]  # train steps from a label to the first train step whose rewards it changed
    seconds_rm: list[float]
    seconds_effect: list[float]
    untaught: int  # labels no version trained on
    rm: str  # the last reward-model version: its held-out accuracy and pairs
    seconds: float
    load: str
    # Each last version's expected arithmetic (workers.models.demo.expected_accuracy on the same
    # held-out problems: exact, no sampling noise), people run's and twin's: beside the sampled
    # figure, it tells a model that lost arithmetic from 800 samples that drew fewer right ones.
    expected_people: float = math.nan
    expected_twin: float = math.nan
    # The blind votes on version 0 against each run's last version (`--blind-votes`): their
    # lines and each run's win rate with its direction check (empty: none asked, or not ready).
    blind_lines: list[str] = field(default_factory=list)
    blind: list[ArmVotes] = field(default_factory=list)

    @property
    def gain(self) -> float:
        """The gain in the preferred share beyond the twin (both start from the same base)."""
        return self.people.share - self.twin.share

    @property
    def arithmetic(self) -> float:
        return self.people.arithmetic - self.twin.arithmetic

    @property
    def expected_arithmetic(self) -> float:
        """The expected (exact) arithmetic, people run's less the twin's."""
        return self.expected_people - self.expected_twin


def pair_runs(*, owner: User, demo: Path, preference: GeneratedRater, seed: int, steps: int, wait: float | None,
              people: int) -> tuple[Any, Any, list[str]]:
    """The people run (its annotators made) and its twin, drafts; the annotators' names."""
    from django.contrib.auth.models import User as Users

    from apps.buffer.importers import taskset_import
    from apps.control.twins import run_twin_create
    from apps.runs.models import RunMember
    from apps.runs.services import run_create
    from workers.models.demo import TASKSET_FILE

    taskset = taskset_import(name=f"live {preference.seed} {seed}", path=demo / TASKSET_FILE, owner=owner)
    config, _ = live_config(model=str(demo), steps=steps, seed=seed, wait=wait)
    run = run_create(name=f"live g{preference.seed} s{seed}", owner=owner, taskset=taskset, config=config)
    twin = run_twin_create(run=run, actor=owner)
    names = [f"p{run.pk}{chr(ord('a') + i)}" for i in range(people)]
    for name in names:
        RunMember.objects.create(run=run, user=Users.objects.create_user(username=name, password=PASSWORD),
                                 role=RunMember.Role.ANNOTATOR)
    return run, twin, names


class PairFailed(RuntimeError):
    """A pair whose runs did not both finish: reported, and the other pairs go on."""


# Set when the bench is ending (a SIGTERM, an error): every pair still running stops waiting.
ABORT = threading.Event()
MEASURING = threading.Lock()


def pair_run(*, url: str, owner: User, demo: Path, preference: GeneratedRater, seed: int, args: argparse.Namespace,
             base: Sampled) -> PairResult:
    """Run the people run and its twin to the end on the live loop, the people labelling
    beside them; then measure both runs' last versions and the labels' lags."""
    from apps.control.twins import run_twins_start
    from apps.runs.models import Run
    from apps.runs.services import run_transition

    run, twin, names = pair_runs(owner=owner, demo=demo, preference=preference, seed=seed, steps=args.steps,
                                 wait=args.wait, people=args.people)
    tag = f"g{preference.seed} s{seed}"
    stop = threading.Event()
    started = time.monotonic()
    people, threads = people_start(url=url, run_id=run.pk, names=names, preference=preference, seed=seed,
                                   pace=Pace(seconds=args.pace, breaks=args.breaks, budget=args.budget), stop=stop)
    run_transition(run=run, action="start", actor=owner)
    run_twins_start(run=run, actor=owner)
    deadline = started + args.minutes * 60
    ended = (Run.Status.FINISHED, Run.Status.STOPPED, Run.Status.FAILED)
    shown = started
    while time.monotonic() < deadline and not ABORT.is_set():
        run.refresh_from_db()
        twin.refresh_from_db()
        if run.status in ended and twin.status in ended:
            break
        if time.monotonic() - shown > 60:
            shown = time.monotonic()
            print(f"  {tag} {shown - started:4.0f} s: people run step {run.train_step}, labels "
                  f"{sum(p.given for p in people)}; twin step {twin.train_step}; {load_average()}", flush=True)
        time.sleep(2)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    for p in people:
        p.rater.http.close()  # no keep-alive connection holds the web server's shutdown
    seconds = time.monotonic() - started
    for r in (run, twin):
        r.refresh_from_db()
        if r.status != Run.Status.FINISHED:
            raise PairFailed(f"{tag}: run #{r.pk} ended {r.status} at train step {r.train_step} of {args.steps} "
                             f"after {seconds:.0f} s: {r.error or 'the time ran out (--minutes)'}")
    for p in people:
        for e in p.errors:
            print(f"  {tag} person {p.rater.username}: {e}", flush=True)
    # Asked before the measurement: the workers write its answers while this thread samples.
    asked = blind_start(url=url, run=run, twin=twin, owner=owner, names=names, demo=demo, seed=seed,
                        prompts=args.blind_votes, tag=tag) if args.blind_votes > 0 else None
    result = pair_measure(run=run, twin=twin, demo=demo, preference=preference, seed=seed, args=args, base=base,
                          breaks=sum(p.breaks for p in people), seconds=seconds)
    if asked is not None:
        blind_finish(result, asked=asked, url=url, run=run, twin=twin, preference=preference, tag=tag)
    return result


# ---------------------------------------------------------------- the blind votes (issue #63 item 6)

VOTERS = 3


@dataclass
class BlindAsked:
    """A blind evaluation asked for, not yet voted on: the evaluation as the API gave it, the
    voters' keys (the owner's first) and the versions it compares."""

    evaluation: dict[str, Any]
    keys: list[str]
    newest: dict[int, int]


def voter_keys(*, run: Any, owner: User, names: list[str]) -> dict[str, str]:
    """Three voters' API keys by username, the owner's first, as each would make one on the keys page: the
    run's owner and its people, with annotators added when the pair has fewer than two people.
    Unthrottled: each voter calls the API twice a vote (next, vote), past a key's default rate
    limit at `--blind-votes` 100."""
    from django.contrib.auth.models import User as Users

    from apps.envapi.services import api_key_create
    from apps.runs.models import RunMember

    voters = [owner, *Users.objects.filter(username__in=names).order_by("username")][:VOTERS]
    while len(voters) < VOTERS:
        voter = Users.objects.create_user(username=f"p{run.pk}v{len(voters)}", password=PASSWORD)
        RunMember.objects.create(run=run, user=voter, role=RunMember.Role.ANNOTATOR)
        voters.append(voter)
    return {v.username: api_key_create(name="blind votes", runs=[run], actions=["read", "feedback"], created_by=v,
                                       rate_limit_per_minute=100_000)[1] for v in voters}


def blind_start(*, url: str, run: Any, twin: Any, owner: User, names: list[str], demo: Path, seed: int, prompts: int,
                tag: str) -> BlindAsked | None:
    """Ask, with the owner's key, for one blind evaluation of version 0 against each run's
    last version on the first `prompts` held-out problems (those the share is measured on: the
    runs here have no evaluation taskset, so the prompts go with the request, as a user uploads
    them). None, with a line, when the API refused."""
    import urllib.error

    from apps.runs.models import ModelVersion
    from workers.models.demo import HELDOUT_FILE

    texts = [json.loads(line)["prompt"] for line in (demo / HELDOUT_FILE).read_text().splitlines()[:prompts]]
    newest = {r.pk: max(ModelVersion.objects.filter(run=r).values_list("number", flat=True)) for r in (run, twin)}
    keys = voter_keys(run=run, owner=owner, names=names)
    try:
        evaluation = blind_ask(url=url, owner_key=keys[owner.username], people=run.pk, twin=twin.pk, newest=newest,
                               voters=list(keys), prompt_count=len(texts), prompts=texts, seed=seed)
    except urllib.error.HTTPError as exc:
        print(f"  {tag} blind votes: the API refused the evaluation: {exc.code} {exc.read()[:500]!r}", flush=True)
        return None
    return BlindAsked(evaluation=evaluation, keys=list(keys.values()), newest=newest)


def blind_finish(result: PairResult, *, asked: BlindAsked, url: str, run: Any, twin: Any, preference: GeneratedRater,
                 tag: str) -> None:
    """The voters vote by the pair's own preference (the function its people label by, without
    their noise: the one the measured share reads) on each pair's prompt and two texts; the
    lines and each run's win rate with its direction check against its measured share move
    (the base's share to the run's last version's) go into `result`."""
    import urllib.error

    try:
        figures = blind_collect(url=url, owner_key=asked.keys[0], keys=asked.keys, people=run.pk,
                                evaluation=asked.evaluation, newest=asked.newest, prefer=preference, seconds=600,
                                log=lambda line: print(f"  {tag} {line}", flush=True))
    except urllib.error.URLError as exc:  # the pair's own figures stand without its votes
        print(f"  {tag} blind votes: the API failed: {exc}", flush=True)
        return
    if figures is None:
        return
    base = result.base.share
    arms = [Arm(run=run.pk, name="people", move=result.people.share - base, start=base, end=result.people.share),
            Arm(run=twin.pk, name="twin", move=result.twin.share - base, start=base, end=result.twin.share)]
    result.blind_lines, result.blind = blind_lines(figures, arms, prefix=f"{tag} ")


def pair_measure(*, run: Any, twin: Any, demo: Path, preference: GeneratedRater, seed: int, args: argparse.Namespace,
                 base: Sampled, breaks: int, seconds: float) -> PairResult:
    """Both runs' last versions sampled on the held-out problems (as bench/steering measures
    them) and rated by the preference; the labels, their lateness and lags."""
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback
    from apps.rewards.models import RewardModel
    from apps.runs.models import ModelVersion

    def last(r: Any) -> str:
        return ModelVersion.objects.get(run=r, train_step=args.steps).checkpoint

    def sampled(r: Any) -> Sampled:
        # One pair's sampling at a time: it seeds torch's global generator, which the pairs share.
        with MEASURING:
            samples = held_out_samples(last(r), demo, max_tokens=32, seed=seed, heldout=args.heldout)
        return samples_rated(samples, preference)

    def exact(r: Any) -> float:
        with MEASURING:  # one model read at a time, as the sampling (the host's cores)
            return held_out_accuracy(last(r), demo, heldout=args.heldout)[0]

    lags = label_lags(run)
    rm = RewardModel.objects.filter(run=run).order_by("-version").first()
    labels = Feedback.objects.filter(run=run, kind="rating")
    return PairResult(
        preference=f"generated:{preference.seed}", description=preference.describe(), mixed=preference.mixed,
        seed=seed, base=base, people=sampled(run), twin=sampled(twin), labels=labels.count(),
        rollouts=Experience.objects.filter(run=run, is_expert=False).count(), late=labels.filter(late=True).count(),
        breaks=breaks, lags_rm=lags.rm_steps, lags_effect=lags.effect_steps, seconds_rm=lags.rm_seconds,
        seconds_effect=lags.effect_seconds, untaught=lags.untaught,
        rm="-" if rm is None else f"v{rm.version} {rm.accuracy or 0:.2f} on {rm.pairs_heldout}",
        seconds=seconds, load=load_average(), expected_people=exact(run), expected_twin=exact(twin))


@dataclass
class Lags:
    rm_steps: list[float] = field(default_factory=list)
    rm_seconds: list[float] = field(default_factory=list)
    effect_steps: list[float] = field(default_factory=list)
    effect_seconds: list[float] = field(default_factory=list)
    untaught: int = 0


def label_lags(run: Any) -> Lags:
    """Per rating of the run: the train steps (and seconds) from it to the first reward-model
    version whose pairs came from it (LabelTaught.taught) and to the first train step whose
    rewards it changed: its own group's, when it was folded (not late); else the first train
    step that trained on completions scored by that version or a newer one. A train step's
    position is counted from the train steps published before the label was saved."""
    from bisect import bisect_right
    from collections import defaultdict

    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback, LabelTaught
    from apps.rewards.models import RewardModel, RewardModelScore
    from apps.runs.models import ModelVersion

    published = sorted((v.created_at, v.train_step) for v in ModelVersion.objects.filter(run=run, train_step__gt=0))
    times = [t for t, _ in published]
    step_at = {s: t for t, s in published}
    versions = {v.version: v.created_at for v in RewardModel.objects.filter(run=run)}
    # The newest reward-model version whose scores each train step trained on.
    newest: dict[int, int] = defaultdict(int)
    for at, scored_by in RewardModelScore.objects.filter(
            experience__run=run, experience__trained_step__isnull=False).values_list(
            "experience__trained_step", "reward_model__version"):
        if at is not None:
            newest[at] = max(newest[at], scored_by)
    taught = dict(LabelTaught.objects.filter(run=run).values_list("feedback_id", "taught"))
    trained = {pk: at for pk, at in Experience.objects.filter(run=run).values_list("pk", "trained_step")
               if at is not None}
    lags = Lags()
    for fb in Feedback.objects.filter(run=run, kind="rating"):
        before = bisect_right(times, fb.created_at)  # train steps published before the label
        version = taught.get(fb.pk)
        if version is None:
            lags.untaught += 1
        else:
            lags.rm_steps.append(bisect_right(times, versions[version]) - before)
            lags.rm_seconds.append((versions[version] - fb.created_at).total_seconds())
        effects = [s for s, v in newest.items() if version is not None and v >= version
                   and step_at[s] > versions[version]]
        own = trained.get(fb.experience_id or 0)
        if not fb.late and own is not None:
            effects.append(own)
        if effects:
            step = min(effects)
            lags.effect_steps.append(step - before)
            lags.effect_seconds.append((step_at[step] - fb.created_at).total_seconds())
    return lags


def load_average() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


# ---------------------------------------------------------------- the report


def lab_gains(path: Path | None, *, steps: int) -> dict[tuple[str, int], float]:
    """From a bench/steering results file (`--out`): per (preference, seed), rm10's share gain
    less `format`'s (the in-process bench's gain beyond the arm without people), for the rows
    run at `steps` steps."""
    if path is None:
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if (r.get("settings") or {}).get("steps") == steps]
    # `format` (no people) runs once per seed; the file holds it read by every preference.
    fmt = {(r["rater"], r["seed"]): r["share_gain"] for r in rows if r["arm"] == "format"}
    by_pair = {(r["rater"], r["seed"]): r["share_gain"] for r in rows if r["arm"] == "rm10"}
    return {pair: gain - fmt[pair] for pair, gain in by_pair.items() if pair in fmt}


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {median(values):.1f} p90 {percentile(values, 0.9):.1f}"


def pair_line(r: PairResult, lab: float | None) -> str:
    lab_words = "-" if lab is None or math.isnan(lab) else f"{lab:+.3f} (live - lab {r.gain - lab:+.3f})"
    return (f"{r.preference}{' mixed' if r.mixed else ''} s{r.seed}: share base {r.base.share:.3f} people "
            f"{r.people.share:.3f} twin {r.twin.share:.3f}, gain beyond twin {r.gain:+.3f}; lab {lab_words}; "
            f"arithmetic people - twin {r.arithmetic:+.3f} (people {r.people.arithmetic:.3f}, twin "
            f"{r.twin.arithmetic:.3f}, base {r.base.arithmetic:.3f}), expected {r.expected_arithmetic:+.3f} "
            f"(people {r.expected_people:.3f}, twin {r.expected_twin:.3f}); labels {r.labels} of {r.rollouts} rollouts "
            f"({r.labels / max(1, r.rollouts):.3f}), late {r.late}, breaks {r.breaks}; lag to rm version (steps) "
            f"{spread(r.lags_rm)}, (s) {spread(r.seconds_rm)}; to effect (steps) {spread(r.lags_effect)}, "
            f"(s) {spread(r.seconds_effect)}; untaught {r.untaught}; rm {r.rm}; {r.seconds:.0f} s, {r.load}")


def verdicts(results: list[PairResult]) -> list[str]:
    """Each target against the pairs: the figure, the target and met / not met."""
    gains = [r.gain for r in results]
    effect = [x for r in results for x in r.lags_effect]
    shares = [r.labels / max(1, r.rollouts) for r in results]
    arithmetic = [r.arithmetic for r in results]
    positive = sum(g > 0 for g in gains)
    rows = [
        ("median gain beyond twin", f"{median(gains):+.3f}", ">= +0.15", median(gains) >= 0.15),
        ("25th percentile", f"{percentile(gains, 0.25):+.3f}", ">= +0.05", percentile(gains, 0.25) >= 0.05),
        ("positive pairs", f"{positive} of {len(gains)}", ">= 80%", positive >= 0.8 * len(gains)),
        ("labels / rollouts (most)", f"{max(shares):.3f}", "<= 0.10", max(shares) <= 0.1 + 1e-9),
        ("label-to-effect lag p90 (train steps)", f"{percentile(effect, 0.9):.1f}", "<= 3",
         bool(effect) and percentile(effect, 0.9) <= 3),
        ("sampled arithmetic people - twin, median", f"{median(arithmetic):+.3f}", ">= -0.02",
         median(arithmetic) >= -0.02),
    ]
    return [f"  {name}: {value} (target {target}): {'met' if ok else 'NOT met'}" for name, value, target, ok in rows]


def blind_summary(results: list[PairResult]) -> str | None:
    """The blind votes over the pairs: how many runs' share moved by more than 0.1 (checked),
    how many of those have their win rate over version 0 on the same side of 0.5 (agreeing),
    and the median votes a ±0.1 interval needs at the observed win rates (None: no votes)."""
    arms = [a for r in results for a in r.blind]
    if not arms:
        return None
    checked = [a for a in arms if a.agree is not None]
    needed = [float(a.votes_for_margin) for a in arms]
    return (f"blind votes over {sum(1 for r in results if r.blind)} pairs ({len(arms)} runs against version 0): "
            f"{len(checked)} checked (share moved > 0.1), {sum(1 for a in checked if a.agree)} agreeing in "
            f"direction; ±0.1 needs median {median(needed):.0f} votes (most {max(needed):.0f})")


def report(results: list[PairResult], *, lab: dict[tuple[str, int], float]) -> None:
    for r in results:
        print(pair_line(r, lab.get((r.preference, r.seed))), flush=True)
        for line in r.blind_lines:
            print(line, flush=True)
    gains = sorted(r.gain for r in results)
    labs = [r.gain - lab[r.preference, r.seed] for r in results if (r.preference, r.seed) in lab]
    print(f"live_steering over {len(results)} pairs: gain beyond twin median {median(gains):+.3f}, spread "
          f"{gains[0]:+.3f}..{gains[-1]:+.3f}; live - lab median "
          f"{'-' if not labs else format(median(labs), '+.3f')}; {load_average()}", flush=True)
    for line in verdicts(results):
        print(line, flush=True)
    expected = [r.expected_arithmetic for r in results if not math.isnan(r.expected_arithmetic)]
    if expected:
        print(f"  beside it, the expected (exact) arithmetic people - twin: median {median(expected):+.3f}, spread "
              f"{min(expected):+.3f}..{max(expected):+.3f} (no sampling noise; the training's own remains)", flush=True)
    if (summary := blind_summary(results)) is not None:
        print(summary, flush=True)


# ---------------------------------------------------------------- main


def overrides_print(overrides: list[Override]) -> None:
    print("the people run's config: the product's defaults (kernel.config) but for these overrides "
          "(its twin: the same, people's feedback and the reward model off)", flush=True)
    for o in overrides:
        print(f"    {o.path} = {o.value!r}  ({o.reason})", flush=True)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--raters", default="generated:2", help="generated:N, N drawn preferences")
    parser.add_argument("--raters-start", type=int, default=6, help="the first drawn preference's seed")
    parser.add_argument("--preferences", default=None,
                        help="the drawn preferences' seeds, comma-separated (e.g. 2,5,6), instead of --raters and "
                             "--raters-start")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=None,
                        help="train steps of each run (default: the demo run's own, rft_demo's --total-steps, 40)")
    parser.add_argument("--people", type=int, default=2, help="simulated annotators (two or three)")
    parser.add_argument("--pace", type=float, default=4.0, help="seconds a label, around which a person's vary")
    parser.add_argument("--breaks", type=float, default=0.04, help="chance of a break after a label")
    parser.add_argument("--budget", type=float, default=0.1, help="the labels' share of the rollouts people stop at")
    parser.add_argument("--wait", type=float, default=None,
                        help="feedback.wait_seconds of the people run (default: the product's window)")
    parser.add_argument("--heldout", type=int, default=200, help="held-out problems sampled (4 each) to measure")
    parser.add_argument("--minutes", type=float, default=40.0, help="give up on a pair after this long")
    parser.add_argument("--lab", type=Path, default=None, help="a bench/steering results file (--out) of these pairs")
    parser.add_argument("--concurrent", type=int, default=1,
                        help="pairs run at once on the one web server and set of workers (each pair's people in threads of their own)")
    parser.add_argument("--blind-votes", type=int, default=20,
                        help="after a pair's runs end, a blind evaluation of version 0 against each run's last version "
                             "on this many held-out prompts, voted through the API by three simulated people (0: none)")
    args = parser.parse_args()
    count = args.raters.removeprefix("generated:")
    if not args.raters.startswith("generated:") or not count.isdigit() or int(count) < 1:
        parser.error(f"--raters {args.raters!r}: expected generated:N")
    if args.preferences is not None and not all(s.strip().isdigit() for s in args.preferences.split(",")):
        parser.error(f"--preferences {args.preferences!r}: expected seeds, comma-separated (2,5,6)")
    if not 1 <= args.people <= 5 or args.pace <= 0 or not 0 < args.budget <= 1 or args.concurrent < 1 \
            or not 0 <= args.blind_votes <= 500 or (args.steps is not None and args.steps < 1):
        parser.error("--people 1..5, --pace above 0, --budget a share above 0, --concurrent at least 1, "
                     "--blind-votes 0..500, --steps at least 1")
    return args


def main() -> None:
    args = arguments()
    # The workers and the server it started stop with it (and its database is dropped at
    # exit), not left running on the broker.
    exit_on_sigterm()
    if not os.environ.get("REDIS_URL"):
        raise SystemExit("bench.live_steering needs a Redis broker: set REDIS_URL (its database is flushed)")
    tmp = Path(tempfile.mkdtemp(prefix="rft-bench-live-"))
    for name, value in (("RFT_STORAGE_DIR", str(tmp / "storage")), ("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"),
                        ("TRANSFORMERS_VERBOSITY", "error"), ("RFT_FAST_PASSWORD_HASHER", "1")):
        os.environ.setdefault(name, value)
    # This process's threads (a pair's, each person's) hold a connection each: no pool of 10 to
    # wait on here (the web server and the workers keep the deployment's own).
    pool = os.environ.get("RFT_DB_POOL_SIZE")
    os.environ["RFT_DB_POOL_SIZE"] = "0"
    setup_django()
    import redis
    import torch
    from django.conf import settings
    from django.contrib.auth.models import User

    from apps.cli.management.commands.rft_demo import DEMO_TOTAL_STEPS
    from workers.models.demo import demo_model_build

    if args.steps is None:
        args.steps = DEMO_TOTAL_STEPS
    torch.set_num_threads(1)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    demo = demo_model_build(out=DEMO_DIR, progress=False, log=lambda _: None).out
    print(demo_model_identity(demo), flush=True)
    owner, _ = User.objects.get_or_create(username="bench-live-owner")
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    preferences = ([preference_draw(int(s)) for s in args.preferences.split(",")] if args.preferences is not None
                   else preference_family(int(args.raters.removeprefix("generated:")), start=args.raters_start))
    seeds = [int(s) for s in args.seeds.split(",")]
    overrides_print(live_config(model=str(demo), steps=args.steps, seed=seeds[0], wait=args.wait)[1])
    print(f"people: {args.people}, a label every ~{args.pace:g} s, breaks {args.breaks:g}, budget {args.budget:g} of "
          f"the rollouts; {load_average()}", flush=True)
    base_samples = {s: held_out_samples(str(demo), demo, max_tokens=32, seed=s, heldout=args.heldout) for s in seeds}
    env = dict(os.environ, DATABASE_URL=BENCH_DB, DJANGO_SETTINGS_MODULE="rftweb.settings", PYTHONPATH=str(ROOT))
    env.pop("RFT_DB_POOL_SIZE")
    if pool is not None:
        env["RFT_DB_POOL_SIZE"] = pool
    # The deployment's one setting for serving several runs: the train worker keeps every
    # running run's policy resident (by default 2; a run evicted rebuilds from its snapshot and
    # replays its journaled steps at nearly every step when more runs share the worker).
    env.setdefault("RFT_TRAINER_RESIDENT_RUNS", str(max(2, 2 * args.concurrent)))
    print(f"the loop: one web server, one Celery worker a queue, {args.concurrent} pair(s) at once; "
          f"RFT_TRAINER_RESIDENT_RUNS={env['RFT_TRAINER_RESIDENT_RUNS']} (every run's policy kept by the "
          f"train worker)", flush=True)
    procs, url = loop_start(env=env, logs=tmp)
    results: list[PairResult] = []
    failed: list[str] = []
    ending: BaseException | None = None
    try:
        pairs_run(pairs=[(p, seed) for seed in seeds for p in preferences], url=url, owner=owner, demo=demo, args=args,
                  base_samples=base_samples, results=results, failed=failed)
    except (SystemExit, KeyboardInterrupt) as exc:  # a SIGTERM or ^C: the pairs done are still reported
        ending = exc
    finally:
        ABORT.set()
        processes_stop(procs)
        (ROOT / ".cache").mkdir(exist_ok=True)
        for log in tmp.glob("*.log"):
            shutil.copy(log, ROOT / ".cache" / f"bench-live-{log.name}")
        shutil.rmtree(tmp, ignore_errors=True)
    for line in failed:
        print(f"pair failed: {line}", flush=True)
    if results:
        report(results, lab=lab_gains(args.lab, steps=args.steps))
    if ending is not None:
        raise ending
    if not results:
        raise SystemExit("no pair finished")


def pairs_run(*, pairs: list[tuple[GeneratedRater, int]], url: str, owner: User, demo: Path, args: argparse.Namespace,
              base_samples: dict[int, list[tuple[str, str]]], results: list[PairResult], failed: list[str]) -> None:
    """Run the pairs, `--concurrent` at a time, on the one loop (the product serving several
    runs at once); each pair's line is printed as it ends, its result appended to `results`
    (a pair that failed: its reason to `failed`, and the others go on)."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    def one(preference: GeneratedRater, seed: int) -> PairResult:
        from django.db import connections

        try:
            return pair_run(url=url, owner=owner, demo=demo, preference=preference, seed=seed, args=args,
                            base=samples_rated(base_samples[seed], preference))
        except PairFailed:
            raise
        except Exception as exc:  # one pair's error is that pair's, not the others'
            raise PairFailed(f"g{preference.seed} s{seed}: {type(exc).__name__}: {exc}") from exc
        finally:
            connections.close_all()  # this thread's connections

    pool = ThreadPoolExecutor(max_workers=args.concurrent, thread_name_prefix="pair")
    running: dict[Future[PairResult], tuple[GeneratedRater, int]] = {}
    try:
        for p, seed in pairs:
            print(f"preference g{p.seed} {p.describe()}, seed {seed}", flush=True)
            running[pool.submit(one, p, seed)] = (p, seed)
        while running:
            done, _ = wait(list(running), timeout=5, return_when=FIRST_COMPLETED)
            for future in done:
                p, seed = running.pop(future)
                try:
                    result = future.result()
                except PairFailed as exc:
                    failed.append(str(exc))
                    print(f"pair failed: {exc}", flush=True)
                    continue
                results.append(result)
                print(pair_line(result, None), flush=True)
                for line in result.blind_lines:
                    print(line, flush=True)
    finally:
        ABORT.set()
        pool.shutdown(wait=True, cancel_futures=True)


if __name__ == "__main__":
    main()
