"""The demo shows what people teach (issue #31 item 4): `make run`'s demo, a person in a real
browser labelling by the guidelines' preference, and the same run beside it without people.

What a new user does, scripted: a fresh var folder, `manage.py migrate`, `manage.py rft_demo`
(the demo model, its taskset and held-out problems, an owner, an annotator, the demo run
under the `learned` policy with guidelines asking for the working shown before the answer), a second
run with the same config and taskset that nobody rates ("without people"), `manage.py
rft_serve` (the embedded default: web, conductor and workers in one process), both runs
started with `manage.py rft start`. Then Chromium (Playwright) logs in as the annotator and
labels up to `--labels` items on the people run's annotation page: for each item it reads the
prompt and the completion off the page and gives the rating the preference gives
(`kernel.preferences`, the same function as `bench.raters:working`), by clicking the
rating and Submit as a person would. The runs train on; at the end the bench prints, per
evaluated version, the share of held-out answers each run writes with the working first
(`eval/preference/working`, sampled answers to the demo's held-out problems), beside the
evaluation accuracy, and the gain of the people run over the run without people.

What each part may see: the runs' rewards are the demo's (`math_accuracy`, `math_format`):
neither knows the preference. The evaluation's share is measured and never rewarded. The
reward model learns the preference from the person's labels alone, over the demo model
itself. Only the scripted person reads the preference, through the page.

    python -m bench demo_teach [--steps 40] [--labels 100] [--feedback-wait 20] [--seed 0 | --seeds 0 1 2]
                               [--rm-gate bound|evidence] [--blind-votes 20] [--headed]

Blind votes (issue #63 item 6, `--blind-votes N`, 0 for none): after both runs end, while the
server is still up, the owner's API key asks the REST API for one blind evaluation of version 0
against the people run's newest version and the twin's newest on N held-out prompts (the run's
evaluation taskset), and the bench polls its state (bounded) until the workers have written the
answers. Three simulated voters (the owner, the demo's annotator and a `voter` the bench adds as
an annotator), each with a key of their own, take the pairs from `/next` and vote through the
API by the same preference the scripted person labels by (`kernel.preferences`): the
higher-rated answer wins, equal ratings tie, both rated lowest "both bad". A voter sees only the
prompt and the two answer texts, sides drawn by the server: never which version or run wrote
which. The figures are read back through the API: per run, the newest version's win rate over
version 0 with its 95% interval, the votes it took and its verdict ("too few votes to tell"
when the interval holds 0.5), checked in direction against the run's measured share move
(last evaluation less first) where that moved by more than 0.1, and the votes a ±0.1 interval
needs at the observed rate.

The twin is the one `rft_demo` makes, the run with people's feedback off
(`apps.control.twins.run_twin_create`: linked, so both run pages show the comparison); it
starts when the people run is started. Both
runs' version 0, the model they start from, is evaluated before they start, so each run's gain
(its last evaluation less its first) counts from the same point. After each seed the bench
prints what the reward model did at every train step of the people run (the newest version,
its held-out accuracy and the gate's lower bound, open or shut and its weight, how many groups'
rewards carry its scores and how many differ by half a rating step or more, the within-group
spread of its part beside the automatic reward's), then each run's rollouts by model version:
the preference's share and the accuracy in and out of that style (what the automatic reward
alone would amplify). Each seed's last line: the people run's final share, the run without
people's, their difference, each run's gain and the gain difference, with the load average;
with `--seeds`, a last line with the gain difference's median and spread.

Not re-measured on the balanced demo model (RECIPE 7, 2026-11-26), whose warm-up writes the
working first a quarter of the time: its smoke (tests/bench_smokes/test_benches.py) runs on it.
Measured 2026-11-25 (styled demo model, recipe 6; guidelines: the working shown first; the
scripted person at about one label a second; load 0.4-3.4; one run each):
- 8 steps, 60 labels: working share 0.219 -> 0.711 with people, 0.055 without (+0.656).
- 20 steps, 100 labels: 0.461 -> 0.984 with people, 0.297 without (+0.688); but from step 12
  the people run's answers lost their tag (share of positive scores 0.95 -> 0.02): the person,
  rating by `working`, gave 5 to calculations that never reached an answer. `working` now rates
  an answer-less completion 1.
- After that fix, 20 steps, 100 labels (given in 171 s; load 6-15): 0.070 -> 0.797 with
  people (0.508 at step 4, rising every evaluation but one), 0.000 without (+0.797); the people
  run's evaluation accuracy 0.922 -> 0.789 at step 18, the run without people's swung 0.43-0.92
  (0.609 at step 18, 0.797 at 20): one run each, no accuracy claim.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from bench.blind import Arm, blind_ask, blind_collect, blind_lines
from bench.raters import correct
from bench.common import (CHROMIUM, CHROMIUM_ARGS, CHROMIUM_BROWSER, DEMO_DIR, ROOT, demo_model_identity,
                          exit_on_sigterm, free_port, health_wait, processes_stop)
from kernel.preferences import preference_get
from rftweb import localpg

if TYPE_CHECKING:
    from playwright.sync_api import Page


def load_average() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


@dataclass
class Demo:
    var: Path
    env: dict[str, str]
    # The style the demo run's guidelines ask for: the first preference its evaluation measures.
    preference: str = ""

    def manage(self, *args: str, timeout: float = 600) -> str:
        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if proc.returncode != 0:
            raise SystemExit(f"manage.py {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc.stdout

    @property
    def cluster(self) -> localpg.Cluster:
        """The embedded default's private PostgreSQL, under the demo's var folder."""
        return localpg.Cluster(data=self.var / "postgres")

    def query(self, sql: str, *params: object) -> list[tuple[object, ...]]:
        import psycopg

        # Up whether or not rft_serve is (it stops the server when it exits).
        localpg.ensure_running(self.cluster, database="rftweb")
        with psycopg.connect(host=str(self.cluster.socket_dir), user=localpg.SUPERUSER, dbname="rftweb") as db:
            return list(db.execute(sql.replace("?", "%s"), params).fetchall())


# Runs inside `manage.py shell`: the run without people, the people run's twin (rft_demo made it:
# its config with people's feedback off, linked so that both run pages compare them:
# apps/control/twins.py).
_TWIN = """
from apps.runs.models import Run
from apps.control.twins import run_twin_create
from apps.cli.management.commands.rft_demo import DEMO_RUN
people = Run.objects.get(name=DEMO_RUN)
people.config = {**people.config, "seed": SEED}
if GATE:
    people.config["feedback"] = {**people.config["feedback"], "rm_gate": GATE}
people.save(update_fields=["config"])
twin = Run.objects.filter(twin_of=people).first() or run_twin_create(run=people)
# rft_demo made the twin: it follows the people run's seed (its feedback stays off).
twin.config = {**twin.config, "seed": SEED}
twin.save(update_fields=["config"])
print(people.pk, twin.pk)
"""


def _json(value: object) -> dict[str, Any]:
    """A jsonb column as psycopg reads it (a dict already), or JSON text."""
    return value if isinstance(value, dict) else json.loads(str(value))


def demo_setup(*, var: Path, steps: int | None, feedback_wait: float, seed: int,
               rm_gate: str | None = None) -> tuple[Demo, int, int]:
    from workers.models.demo import demo_model_build

    model = demo_model_build(out=DEMO_DIR, progress=True).out
    print(demo_model_identity(model), flush=True)
    # The embedded default, as `make run` serves it: no DATABASE_URL or REDIS_URL (with Redis,
    # rft_serve leaves the workers to Celery processes of their own).
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME"}}
    env.update(RFT_VAR_DIR=str(var), RFT_DEMO_MODEL_DIR=str(model), PYTHONUNBUFFERED="1")
    demo = Demo(var=var, env=env)
    demo.manage("migrate", "--noinput", "-v", "0")
    # Without --steps, the demo run's own length (rft_demo's --total-steps default).
    length = [] if steps is None else ["--total-steps", str(steps)]
    demo.manage("rft_demo", *length, "--feedback-wait", str(feedback_wait), "--password", "pw")
    people, twin = (int(x) for x in demo.manage("shell", "-c", _TWIN.replace("SEED", str(seed)).replace("GATE", repr(rm_gate or ""))).split()[-2:])
    ((config,),) = demo.query("SELECT config FROM runs_run WHERE id = ?", people)
    demo.preference = _json(config)["eval"]["preferences"][0]
    return demo, people, twin


def person_labels(*, url: str, run: int, preference: str, labels: int, until: float, headed: bool,
                  done: Callable[[], bool]) -> int:
    """The annotator in Chromium: rate items by the preference until `labels` are given, the
    run has ended (`done()`), or the clock passes `until`. Returns the labels given."""
    from playwright.sync_api import sync_playwright

    prefer = preference_get(preference)
    given = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(headless=not headed, executable_path=CHROMIUM_BROWSER if headed else CHROMIUM,
                                     args=[a for a in CHROMIUM_ARGS if a != "--headless" or not headed])
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{url}/login/?next=/runs/{run}/annotate/")
        page.fill("#id_username", "annotator")
        page.fill("#id_password", "pw")
        page.click("button[type=submit]")
        page.wait_for_selector("#annotate")
        while given < labels and time.monotonic() < until and not done():
            first = page.locator("#queue article.item:not(.done)").first
            if first.count() == 0:
                # Nothing waiting for people right now: the run is between steps. Look again.
                time.sleep(2)
                page.goto(f"{url}/runs/{run}/annotate/")
                continue
            # The card by its id, read before the click: a locator is looked up again at each
            # use, and once the answer marks this card done, "the first open card" is the next
            # one (seed 1, 2026-11-28: the 6th label stored, the script then waited on the 7th
            # card, which nobody had rated, until the run ended).
            assignment = first.get_attribute("data-assignment")
            experience = first.get_attribute("data-experience")
            item = page.locator(f"#item-{assignment}")
            score = prefer.rate(item.locator(".prompt").inner_text(), item.locator(".completion").inner_text())
            item.locator(f"input[name=score][value='{score}']").check()
            item.locator("form.rate button[type=submit]").click()
            saved = saved_wait(page, f"#item-{assignment}.done", until=until, done=done,
                               reload=f"{url}/runs/{run}/annotate/", experience=str(experience))
            if saved is None:
                break
            given += int(saved)
        browser.close()
    return given


def saved_wait(page: Page, selector: str, *, until: float, done: Callable[[], bool], reload: str,
               experience: str) -> bool | None:
    """Wait for the page to mark a label saved: on a loaded host saving one took over 30 s
    (load 11-16). After each 30 s without the mark, reload the page and read the label's state
    from it: saved if "Your submissions" lists a label on the item, else not saved (the loop
    rates whatever is open then), so no wait can outlast the run. None when it gave up (the
    run ended, or `until`)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    while True:
        try:
            page.wait_for_selector(selector, timeout=max(1.0, min(30.0, until - time.monotonic())) * 1000)
            return True
        except PlaywrightTimeout:
            if time.monotonic() >= until or done():
                return None
        try:
            page.goto(reload)
            page.wait_for_selector("#annotate")
        except PlaywrightTimeout:
            continue
        mine = page.locator(f"#mine li.submission[data-targets~='{experience}']")
        print(f"a label's saved mark did not show in 30 s; after a reload it is {'stored' if mine.count() else 'not stored'}; "
              f"{load_average()}", flush=True)
        return mine.count() > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="train steps of both runs (default: the demo run's own, rft_demo's --total-steps, 40)")
    parser.add_argument("--labels", type=int, default=100)
    parser.add_argument("--feedback-wait", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", help="several seeds, one after another (the median and spread)")
    parser.add_argument("--rm-gate", choices=["bound", "evidence"],
                        help="feedback.rm_gate of both runs (default: the config's own)")
    parser.add_argument("--minutes", type=float, default=60.0, help="give up on a seed after this long")
    parser.add_argument("--headed", action="store_true")
    parser.add_argument("--blind-votes", type=int, default=20,
                        help="after both runs, a blind evaluation of version 0 against each run's newest on this "
                             "many held-out prompts, voted by three simulated people (0: none)")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    exit_on_sigterm()  # the demo's server, its private PostgreSQL and its folder go with it
    gains = [demo_once(args, seed=seed) for seed in (args.seeds or [args.seed])]
    if len(gains) > 1:
        ordered = sorted(gains)
        print(f"demo_teach over seeds {args.seeds}: gain difference median {_median(gains):+.3f}, "
              f"spread {ordered[0]:+.3f}..{ordered[-1]:+.3f}, positive on {sum(g > 0 for g in gains)} of {len(gains)}; "
              f"{load_average()}")


def demo_once(args: argparse.Namespace, *, seed: int) -> float:
    """One seed of the demo with a person and its twin; returns the people run's gain in the
    preference share minus the twin's."""
    started = time.monotonic()
    deadline = started + args.minutes * 60
    # The private PostgreSQL stops before its data folder goes.
    with tempfile.TemporaryDirectory(prefix="rft-demo-teach-") as tmp, \
            localpg.stopped_after(localpg.Cluster(data=Path(tmp) / "postgres")):
        var = Path(tmp)
        demo, people, twin = demo_setup(var=var, steps=args.steps, feedback_wait=args.feedback_wait, seed=seed,
                                        rm_gate=args.rm_gate)
        print(f"demo runs (seed {seed}): #{people} with a person labelling by {demo.preference}, #{twin} without "
              f"people; {load_average()}", flush=True)
        evaluated = time.monotonic()
        start_evaluate(demo, people=people, twin=twin)
        eval_seconds = (time.monotonic() - evaluated) / 2
        print(f"version 0 evaluated: {eval_seconds:.0f} s an evaluation (with the shell's start); {load_average()}",
              flush=True)
        given, figures = demo_serve(demo, args=args, people=people, twin=twin, deadline=deadline, started=started,
                                    eval_seconds=eval_seconds)
        print(demo.manage("shell", "-c", f"from bench.demo_teach import rm_probe_print, style_print; "
                                         f"rm_probe_print({people}); style_print({people}, {demo.preference!r}); "
                                         f"style_print({twin}, {demo.preference!r})"), end="", flush=True)
        gain, moves = report(demo, people=people, twin=twin, given=given, seconds=time.monotonic() - started)
        expected_print(demo, people=people, twin=twin)
        if figures is not None:
            blind_print(figures, people=people, twin=twin, moves=moves)
        return gain


def start_evaluate(demo: Demo, *, people: int, twin: int) -> None:
    """Evaluate both runs' version 0, the model they both start from, before they start: each
    run's gain is then counted from the same point (the demo evaluates every second version,
    and by the people run's first, step 2, people's labels have already moved it)."""
    demo.manage("shell", "-c", "from workers.explore.evaluation import evaluate_version; "
                               f"evaluate_version(run_id={people}, version=0); evaluate_version(run_id={twin}, version=0)")


def demo_serve(demo: Demo, *, args: argparse.Namespace, people: int, twin: int, deadline: float,
               started: float, eval_seconds: float) -> tuple[int, dict[str, Any] | None]:
    """Serve the demo, start both runs, label as the person until done, wait for both runs and
    their last evaluations, then (with `--blind-votes`) the blind votes on the newest versions;
    returns the labels given and the blind evaluation's figures."""
    port = free_port()
    log_path = demo.var / "serve.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen([sys.executable, "manage.py", "rft_serve", "--port", str(port)], cwd=ROOT,
                                  env=demo.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            if not health_wait(url, seconds=120, poll=0.5, alive=lambda: server.poll() is None):
                raise SystemExit("rft_serve did not come up:\n" + log_path.read_text()[-3000:])
            demo.manage("rft", "start", str(people))  # its twin, a draft, starts with it

            def ended(run: int) -> bool:
                ((status,),) = demo.query("SELECT status FROM runs_run WHERE id = ?", run)
                return status != "running"

            given = person_labels(url=url, run=people, preference=demo.preference, labels=args.labels,
                                  until=deadline, headed=args.headed, done=lambda: ended(people))
            print(f"the person gave {given} labels in {time.monotonic() - started:.0f} s; {load_average()}", flush=True)
            while time.monotonic() < deadline and not (ended(people) and ended(twin)):
                time.sleep(2)
            # The last versions' evaluations are sent on publish and run beside the trainer:
            # they may land after their run ended (the server must still be up for them).
            # Bounded by what it waits for: two evaluations a run at most, each as long as
            # version 0's took, with room for a loaded host (and never under the former 180 s).
            evaluated_by = min(deadline, time.monotonic() + max(180.0, 6 * eval_seconds))
            every = {run: eval_every(demo, run) for run in (people, twin)}
            while time.monotonic() < evaluated_by and any(evaluations_due(demo, run, every[run]) for run in every):
                time.sleep(2)
            figures = None
            if args.blind_votes > 0:
                figures = blind_votes(demo, url=url, people=people, twin=twin, prompts=args.blind_votes,
                                      seconds=max(60.0, min(600.0, deadline - time.monotonic())))
        finally:
            processes_stop([server], group=True)
    return given, figures


def eval_every(demo: Demo, run: int) -> int:
    ((config,),) = demo.query("SELECT config FROM runs_run WHERE id = ?", run)
    return int(_json(config).get("eval_every") or 0)


def evaluations_due(demo: Demo, run: int, every: int) -> set[int]:
    """The train steps of the run's published versions its held-out evaluation is due on
    (every `every`-th version after the first) that have no `eval/accuracy` yet."""
    if not every:
        return set()
    versions = demo.query("SELECT number, train_step FROM runs_modelversion WHERE run_id = ?", run)
    due = {int(str(step)) for number, step in versions if int(str(number)) and int(str(number)) % every == 0}
    done = {int(str(step)) for (step,) in demo.query(
        "SELECT step FROM runs_metric WHERE run_id = ? AND name = 'eval/accuracy'", run)}
    return due - done


def report(demo: Demo, *, people: int, twin: int, given: int, seconds: float) -> tuple[float, dict[int, float]]:
    """Print both runs' shares and accuracy by step; returns the gain difference and each run's
    share move (its last evaluation's less its first's)."""
    rows = demo.query("SELECT id, status, error FROM runs_run WHERE id IN (?, ?)", people, twin)
    statuses = {int(str(pk)): str(status) for pk, status, _ in rows}
    for pk, status, error in rows:
        if status == "failed":
            print(f"run #{pk} failed: {error}\n--- serve log ---\n{(demo.var / 'serve.log').read_text()[-4000:]}")

    def series(run: int, name: str) -> dict[int, float]:
        rows = demo.query("SELECT step, value FROM runs_metric WHERE run_id = ? AND name = ? ORDER BY step", run, name)
        return {int(str(step)): float(str(value)) for step, value in rows}

    share = f"eval/preference/{demo.preference}"
    shares = {run: series(run, share) for run in (people, twin)}
    accuracy = {run: series(run, "eval/accuracy") for run in (people, twin)}
    labels = demo.query("SELECT count(*) FROM feedback_feedback f JOIN buffer_experience e ON e.id = f.experience_id "
                        "WHERE e.run_id = ?", people)[0][0]
    print(f"{'step':>5} {'share people':>13} {'share without':>14} {'acc people':>11} {'acc without':>12}")
    for step in sorted(set(shares[people]) | set(shares[twin])):
        def cell(table: dict[int, dict[int, float]], run: int) -> str:
            value = table[run].get(step)
            return "-" if value is None else f"{value:.3f}"
        print(f"{step:>5} {cell(shares, people):>13} {cell(shares, twin):>14} {cell(accuracy, people):>11} "
              f"{cell(accuracy, twin):>12}")
    if not shares[people] or not shares[twin]:
        raise SystemExit(f"no {share} measured (runs ended {statuses}); see the serve log")
    gain = {run: share_gain(shares[run]) for run in (people, twin)}
    first = shares[people][min(shares[people])]
    last_people, last_twin = shares[people][max(shares[people])], shares[twin][max(shares[twin])]
    print(f"runs ended: people {statuses[people]}, without people {statuses[twin]}; labels given {given}, stored {labels}; "
          f"{seconds:.0f} s")
    print(f"demo_teach: {demo.preference} share {first:.3f} -> people {last_people:.3f} vs without people {last_twin:.3f} "
          f"(difference {last_people - last_twin:+.3f}); gain people {gain[people]:+.3f}, without people "
          f"{gain[twin]:+.3f}, gain difference {gain[people] - gain[twin]:+.3f}; {load_average()}", flush=True)
    return gain[people] - gain[twin], gain


def expected_print(demo: Demo, *, people: int, twin: int) -> None:
    """Version 0 and both runs' newest versions read off the clock on all 200 held-out problems,
    two ways: the expected accuracy (workers.models.demo.expected_accuracy, the probability of
    sampling a right answer in one of the warm-up's forms word for word: exact, but blind to a
    form a run learned of its own) and the sampled arithmetic, 8 answers a problem at
    temperature 1 with the same seed for every version (1,600 answers, read in any style: one
    standard error about 0.009, and the versions' draws paired). The demo's own evaluation
    samples 64 problems x 2 (one standard error about 0.034)."""
    from bench.steering.measurement import held_out_accuracy, held_out_samples, samples_rated

    prefer = preference_get(demo.preference)

    def read(folder: str) -> HeldOut:
        samples = held_out_samples(folder, DEMO_DIR, max_tokens=32, seed=0, samples=8)
        sampled = samples_rated(samples, lambda _p, _c: 0)
        return HeldOut(held_out_accuracy(folder, DEMO_DIR)[0], sampled.arithmetic, sampled.untagged,
                       style_split(samples, prefer.liked))

    newest: dict[str, tuple[int, HeldOut]] = {}
    for name, run in (("people", people), ("twin", twin)):
        ((number, checkpoint),) = demo.query(
            "SELECT number, checkpoint FROM runs_modelversion WHERE run_id = ? ORDER BY number DESC LIMIT 1", run)
        if not (Path(str(checkpoint)) / "config.json").is_file():  # an adapter or a key: no whole model
            print(f"demo_teach: run #{run}'s v{number} is not a model folder ({checkpoint}): no held-out reading")
            return
        newest[name] = int(str(number)), read(str(checkpoint))
    v0 = read(str(DEMO_DIR))
    (people_v, people_read), (twin_v, twin_read) = newest["people"], newest["twin"]
    for what, words, start, ours, theirs in (
            ("expected accuracy", "exact", v0.expected, people_read.expected, twin_read.expected),
            ("sampled arithmetic", "8 answers each", v0.sampled, people_read.sampled, twin_read.sampled)):
        print(f"demo_teach: {what} on all 200 held-out problems ({words}): v0 {start:.3f} -> people v{people_v} "
              f"{ours:.3f} ({ours - start:+.3f}), twin v{twin_v} {theirs:.3f} ({theirs - start:+.3f}); "
              f"{load_average()}", flush=True)
    print(f"demo_teach: untagged share of those sampled answers: v0 {v0.untagged:.3f}, people v{people_v} "
          f"{people_read.untagged:.3f}, twin v{twin_v} {twin_read.untagged:.3f}", flush=True)
    print(f"demo_teach: those answers in / out of the {demo.preference} style (share; arithmetic in / out): "
          f"v0 {v0.style}, people v{people_v} {people_read.style}, twin v{twin_v} {twin_read.style}", flush=True)


class HeldOut(NamedTuple):
    """One model read on the held-out problems (expected_print)."""

    expected: float
    sampled: float
    # Sampled answers that never reached an `<answer>` (cut off at the run's 32 tokens, or
    # none written), which the sampled arithmetic counts wrong.
    untagged: float
    style: StyleSplit  # the preference's share of the answers, the arithmetic in and out of it


@dataclass(frozen=True)
class StyleSplit:
    """Sampled answers split by a style: its share, and the arithmetic in it and out of it
    (None where no answer falls on that side). Whether amplifying a style costs arithmetic by
    itself (the style less often right) or within each style (both less often right)."""

    share: float
    inside: float | None
    outside: float | None

    def __str__(self) -> str:
        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"

        return f"{self.share:.3f}; {fmt(self.inside)} / {fmt(self.outside)}"


def style_split(samples: list[tuple[str, str]], liked: Callable[[str, str], bool]) -> StyleSplit:
    sides: dict[bool, list[bool]] = {True: [], False: []}
    for prompt, completion in samples:
        sides[liked(prompt, completion)].append(correct(prompt, completion) == 5)

    def mean(xs: list[bool]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return StyleSplit(share=len(sides[True]) / max(1, len(samples)), inside=mean(sides[True]), outside=mean(sides[False]))


def share_gain(series: dict[int, float]) -> float:
    """A run's gain in a share: its last evaluation's less its first's."""
    return series[max(series)] - series[min(series)]



# --- What the reward model did at each train step (issue #46 item 4's question) ---------------

# A group's reward-model parts differing by less than this (half a rating step on the human
# scale) do not move its advantages beyond the automatic reward's (bench/steering's SIGNAL).
SIGNAL = 0.125


@dataclass(frozen=True)
class StepProbe:
    """One train step of a `learned` run, read back from its rows after the run: the newest
    reward-model version when the step published, whether the gate let it score and with what
    weight, and how many of the step's groups had advantages carrying its signal beside the
    spread of the automatic reward inside a group."""

    step: int
    labels: int  # labels stored by the time the step published
    version: int | None
    accuracy: float | None
    heldout: int
    bound: float | None
    open: bool
    weight: float
    groups: int
    rm_groups: int  # groups with a member rewarded by the reward model
    signal_groups: int  # ... whose reward-model parts differ by >= SIGNAL
    rm_sd: float | None  # median over rm groups of the within-group sd of w_rm x its part
    auto_sd: float  # median over groups of the within-group sd of w_auto x automatic reward


def _sd(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return float((sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5)  # float ** float is Any in typeshed


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _rm_parts(members: list[dict[str, Any]], scored: dict[int, list[tuple[Any, float]]], feedback_cfg: Any) -> list[float]:
    """w_rm x the reward-model part of each member whose reward is the learned fold of one of
    its scores (a member people rated, or one the fallback rewarded, has none)."""
    from apps.feedback.reward_model.versions import reward_model_weight, rm_reward_score
    from kernel.fold import reward_learned

    parts = []
    for m in members:
        if m["human_reward"] is not None or m["reward"] is None:
            continue
        for rm, score in scored.get(m["pk"], []):
            part = rm_reward_score(rm=rm, score=score, weight=reward_model_weight(run=rm.run, rm=rm))
            if abs(m["reward"] - reward_learned(feedback_cfg=feedback_cfg, auto=m["auto_reward"], rm=part)) < 1e-6:
                parts.append(feedback_cfg.w_rm * part)
                break
    return parts


def step_probe(*, run: Any, step: int, at: Any) -> StepProbe:
    """The probe of train step `step` of `run`, which published at `at` (inside Django)."""
    from collections import defaultdict

    from apps.buffer.models import Experience
    from apps.feedback.reward_model.versions import reward_model_gate_open, reward_model_lower_bound, reward_model_weight
    from apps.feedback.models import Feedback
    from apps.rewards.models import RewardModel, RewardModelScore

    feedback_cfg = run.cfg.feedback
    rm = RewardModel.objects.filter(run=run, created_at__lte=at).order_by("-version").first()
    opened = rm is not None and reward_model_gate_open(run=run, rm=rm)
    rows = list(Experience.objects.filter(run=run, trained_step=step, is_expert=False)
                .values("pk", "group_id", "reward", "auto_reward", "human_reward"))
    scored: dict[int, list[tuple[Any, float]]] = defaultdict(list)
    for score in RewardModelScore.objects.filter(experience_id__in=[r["pk"] for r in rows]).select_related(
            "reward_model__run"):
        scored[score.experience_id].append((score.reward_model, score.score))
    groups: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        groups[row["group_id"]].append(row)
    parts = [p for p in (_rm_parts(members, scored, feedback_cfg) for members in groups.values()) if p]
    return StepProbe(
        step=step, labels=Feedback.objects.filter(run=run, created_at__lte=at).count(),
        version=rm.version if rm else None, accuracy=rm.accuracy if rm else None, heldout=rm.pairs_heldout if rm else 0,
        bound=reward_model_lower_bound(run=run, rm=rm) if rm else None, open=opened,
        weight=reward_model_weight(run=run, rm=rm) if rm is not None and opened else 0.0,
        groups=len(groups), rm_groups=len(parts), signal_groups=sum(max(p) - min(p) >= SIGNAL for p in parts),
        rm_sd=_median([_sd(p) for p in parts]) if parts else None,
        auto_sd=_median([_sd([feedback_cfg.w_auto * (m["auto_reward"] or 0.0) for m in ms]) for ms in groups.values()])
        if groups else 0.0)


def probe_line(p: StepProbe) -> str:
    gate = "-" if p.version is None else (
        f"v{p.version} {p.accuracy or 0:.2f}/{p.heldout} lb {p.bound or 0:.2f} "
        + (f"OPEN x{p.weight:.2f}" if p.open else "shut"))
    rm_sd = "-" if p.rm_sd is None else f"{p.rm_sd:.3f}"
    return (f"  step {p.step:>3} labels {p.labels:>3}  rm {gate}  groups rm {p.rm_groups}/{p.groups} "
            f"signal {p.signal_groups}  sd rm {rm_sd} auto {p.auto_sd:.3f}")


def rm_probe_print(run_id: int) -> None:
    """Print the probe of every train step of run `run_id` (called in `manage.py shell`)."""
    from apps.runs.models import ModelVersion, Run

    run = Run.objects.get(pk=run_id)
    print(f"reward model per train step, run #{run_id} (gate {run.cfg.feedback.rm_gate}, "
          f"min accuracy {run.cfg.feedback.min_rm_accuracy}):")
    for version in ModelVersion.objects.filter(run=run, train_step__gt=0).order_by("train_step"):
        print(probe_line(step_probe(run=run, step=version.train_step, at=version.created_at)))


def style_print(run_id: int, preference: str, *, every: int = 5) -> None:
    """Print, per `every` model versions of run `run_id`'s rollouts, the share the preference
    likes and the answers' accuracy in and out of that style: a style that is more often right
    rises on the automatic reward alone (called in `manage.py shell`)."""
    from collections import defaultdict

    from apps.buffer.models import Experience

    liked = preference_get(preference).liked
    tally: dict[int, list[list[float]]] = defaultdict(lambda: [[], []])
    for prompt, completion, version, parts in Experience.objects.filter(run_id=run_id, is_expert=False).values_list(
            "prompt_text", "response_text", "model_version", "reward_parts"):
        right = float((parts or {}).get("math_accuracy", 0.0))
        tally[version // every][0 if liked(prompt, completion) else 1].append(right)
    print(f"run #{run_id} rollouts by model version: {preference} share, accuracy in / out of that style")
    for window in sorted(tally):
        styled, other = tally[window]
        n = len(styled) + len(other)

        def mean(xs: list[float]) -> str:
            return f"{sum(xs) / len(xs):.2f}" if xs else "-"
        print(f"  v{window * every:>3}-{window * every + every - 1:<3} n {n:>4}  share {len(styled) / n:.2f}  "
              f"accuracy {mean(styled)} / {mean(other)}")



# --- Blind votes on the versions (issue #63 item 6) ----------------------------------------------

# Runs inside `manage.py shell`: the voters' API keys, as each would make one on the keys page
# (the owner, the demo's annotator and a second annotator the bench adds to the people run).
_KEYS = """
from django.contrib.auth.models import User
from apps.envapi.services import api_key_create
from apps.runs.models import Run
from apps.runs.services import run_member_add
people = Run.objects.get(pk=PEOPLE)
if not User.objects.filter(username="voter").exists():
    User.objects.create_user("voter", password="pw")
    run_member_add(run=people, username="voter", role="annotator")
# Unthrottled: each voter calls the API twice a vote (next, vote), and --blind-votes 100 is
# some 330 votes, past a key's default rate limit (429 Too Many Requests).
for name in ("owner", "annotator", "voter"):
    print(name, api_key_create(name="blind votes", runs=[people], actions=["read", "feedback"],
                               created_by=User.objects.get(username=name), rate_limit_per_minute=100_000)[1])
"""


def blind_votes(demo: Demo, *, url: str, people: int, twin: int, prompts: int, seconds: float) -> dict[str, Any] | None:
    """The voters' keys (the owner's, the demo's annotator's and a `voter`'s), then one blind
    evaluation of version 0 against the people run's and the twin's newest versions, voted by
    the guidelines' preference (bench/blind); its figures (None when the answers were not ready
    in time)."""
    lines = [line.split() for line in demo.manage("shell", "-c", _KEYS.replace("PEOPLE", str(people))).splitlines()]
    keys = {words[0]: words[1] for words in lines if len(words) == 2 and words[0] in {"owner", "annotator", "voter"}}
    newest = {run: int(str(demo.query("SELECT max(number) FROM runs_modelversion WHERE run_id = ?", run)[0][0]))
              for run in (people, twin)}
    evaluation = blind_ask(url=url, owner_key=keys["owner"], people=people, twin=twin, newest=newest,
                           voters=sorted(keys), prompt_count=prompts)
    return blind_collect(url=url, owner_key=keys["owner"], keys=list(keys.values()), people=people,
                         evaluation=evaluation, newest=newest, prefer=preference_get(demo.preference).rate,
                         seconds=seconds, log=lambda line: print(line, flush=True))


def blind_print(figures: dict[str, Any], *, people: int, twin: int, moves: dict[int, float]) -> None:
    """Per version against version 0: the win rate with its interval and votes, the verdict,
    the direction check against the run's measured share move, the votes a ±0.1 interval needs."""
    lines, _ = blind_lines(figures, [Arm(run=people, name="people", move=moves[people]),
                                     Arm(run=twin, name="without people", move=moves[twin])])
    for line in lines:
        print(line, flush=True)


if __name__ == "__main__":
    main()
