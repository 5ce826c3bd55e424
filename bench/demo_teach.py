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

    python -m bench demo_teach [--steps 40] [--labels 100] [--feedback-wait 20] [--seed 0] [--headed]

The last line: the people run's final share, the run without people's, and their
difference, with the load average.

Not re-measured on the balanced demo model (RECIPE 7, 2026-11-26), whose warm-up writes the
working first a quarter of the time: its smoke (tests/test_bench_smokes.py) runs on it.
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
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import CHROMIUM, CHROMIUM_ARGS, DEMO_DIR, ROOT, free_port, health_wait
from rftweb import localpg


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


# Runs inside `manage.py shell`: the run without people, the people run's config and taskset.
_TWIN = """
from apps.runs.models import Run
from apps.runs.services import run_create
from apps.cli.management.commands.rft_demo import DEMO_RUN
people = Run.objects.get(name=DEMO_RUN)
people.config = {**people.config, "seed": SEED}
people.save(update_fields=["config"])
twin = Run.objects.filter(name=DEMO_RUN + " (without people)").first() or run_create(
    name=DEMO_RUN + " (without people)", owner=people.owner, config=people.config, taskset=people.taskset)
print(people.pk, twin.pk)
"""


def _json(value: object) -> dict[str, Any]:
    """A jsonb column as psycopg reads it (a dict already), or JSON text."""
    return value if isinstance(value, dict) else json.loads(str(value))


def demo_setup(*, var: Path, steps: int, feedback_wait: float, seed: int) -> tuple[Demo, int, int]:
    from workers.demo_model import demo_model_build

    model = demo_model_build(out=DEMO_DIR, progress=True).out
    # The embedded default, as `make run` serves it: no DATABASE_URL or REDIS_URL (with Redis,
    # rft_serve leaves the workers to Celery processes of their own).
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "TEST_DATABASE_NAME"}}
    env.update(RFT_VAR_DIR=str(var), RFT_DEMO_MODEL_DIR=str(model), PYTHONUNBUFFERED="1")
    demo = Demo(var=var, env=env)
    demo.manage("migrate", "--noinput", "-v", "0")
    demo.manage("rft_demo", "--total-steps", str(steps), "--feedback-wait", str(feedback_wait), "--password", "pw")
    people, twin = (int(x) for x in demo.manage("shell", "-c", _TWIN.replace("SEED", str(seed))).split()[-2:])
    ((config,),) = demo.query("SELECT config FROM runs_run WHERE id = ?", people)
    demo.preference = _json(config)["eval"]["preferences"][0]
    return demo, people, twin


def person_labels(*, url: str, run: int, preference: str, labels: int, until: float, headed: bool,
                  done: Callable[[], bool]) -> int:
    """The annotator in Chromium: rate items by the preference until `labels` are given, the
    run has ended (`done()`), or the clock passes `until`. Returns the labels given."""
    from playwright.sync_api import sync_playwright

    from kernel.preferences import preference_get

    prefer = preference_get(preference)
    given = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(headless=not headed, executable_path=CHROMIUM, args=[a for a in CHROMIUM_ARGS if a != "--headless" or not headed])
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{url}/login/?next=/runs/{run}/annotate/")
        page.fill("#id_username", "annotator")
        page.fill("#id_password", "pw")
        page.click("button[type=submit]")
        page.wait_for_selector("#annotate")
        while given < labels and time.monotonic() < until and not done():
            item = page.locator("#queue article.item:not(.done)").first
            if item.count() == 0:
                # Nothing waiting for people right now: the run is between steps. Look again.
                time.sleep(2)
                page.goto(f"{url}/runs/{run}/annotate/")
                continue
            prompt = item.locator(".prompt").inner_text()
            completion = item.locator(".completion").inner_text()
            score = prefer.rate(prompt, completion)
            item.locator(f"input[name=score][value='{score}']").check()
            item.locator("form.rate button[type=submit]").click()
            assignment = item.get_attribute("data-assignment")
            page.wait_for_selector(f"#item-{assignment}.done")
            given += 1
        browser.close()
    return given


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--labels", type=int, default=100)
    parser.add_argument("--feedback-wait", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=60.0, help="give up after this long")
    parser.add_argument("--headed", action="store_true")
    args = parser.parse_args()

    started = time.monotonic()
    deadline = started + args.minutes * 60
    # The private PostgreSQL stops before its data folder goes.
    with tempfile.TemporaryDirectory(prefix="rft-demo-teach-") as tmp, \
            localpg.stopped_after(localpg.Cluster(data=Path(tmp) / "postgres")):
        var = Path(tmp)
        demo, people, twin = demo_setup(var=var, steps=args.steps, feedback_wait=args.feedback_wait, seed=args.seed)
        print(f"demo runs: #{people} with a person labelling by {demo.preference}, #{twin} without people; {load_average()}",
              flush=True)
        port = free_port()
        log_path = var / "serve.log"
        with log_path.open("wb") as log:
            server = subprocess.Popen([sys.executable, "manage.py", "rft_serve", "--port", str(port)], cwd=ROOT,
                                      env=demo.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                url = f"http://127.0.0.1:{port}"
                if not health_wait(url, seconds=120, poll=0.5, alive=lambda: server.poll() is None):
                    raise SystemExit("rft_serve did not come up:\n" + log_path.read_text()[-3000:])
                for run in (people, twin):
                    demo.manage("rft", "start", str(run))

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
                evaluated_by = min(deadline, time.monotonic() + 180)
                every = {run: eval_every(demo, run) for run in (people, twin)}
                while time.monotonic() < evaluated_by and any(evaluations_due(demo, run, every[run]) for run in every):
                    time.sleep(2)
            finally:
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
        report(demo, people=people, twin=twin, given=given, seconds=time.monotonic() - started)


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


def report(demo: Demo, *, people: int, twin: int, given: int, seconds: float) -> None:
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
    first = shares[people][min(shares[people])]
    last_people, last_twin = shares[people][max(shares[people])], shares[twin][max(shares[twin])]
    print(f"runs ended: people {statuses[people]}, without people {statuses[twin]}; labels given {given}, stored {labels}; "
          f"{seconds:.0f} s")
    print(f"demo_teach: {demo.preference} share {first:.3f} -> people {last_people:.3f} vs without people {last_twin:.3f} "
          f"(difference {last_people - last_twin:+.3f}); {load_average()}")


if __name__ == "__main__":
    main()
