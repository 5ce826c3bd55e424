"""`manage.py rft …`: runs from the command line.

  rft create CONFIG --name NAME [--owner USER] [--taskset FILE]   create a draft run
  rft start|pause|resume|stop RUN [--as USER]                      move a run (audited)
  rft export RUN --format sft|dpo|grpo|preferences --out PATH [--hf]   export the buffer
  rft weights RUN [--version N] --out DIR [--merged]                 export a version's weights
  rft reward-model RUN [--version N] --out DIR                      export the learned reward model
  rft worker --queues rollout,train [--concurrency N] [--dry-run]  start Celery workers
  rft list                                                          the runs, one a line
  rft feedback RUN rating|ranking|pairwise|flag|edit --as USER …    give feedback as a person
  rft evaluation create RUN --as OWNER [--versions 0,5] [--prompts N] [--prompts-file F] [--placement between] …
  rft evaluation figures EVALUATION | export EVALUATION --out PATH | close EVALUATION --as OWNER
                                                                    blind side-by-side evaluations

Every failure prints a message and exits non-zero (CommandError).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from argparse import SUPPRESS, ArgumentParser
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, overload

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.buffer.importers import ImportFailed
from apps.cli.evaluation import evaluation_command, evaluation_figures_lines
from apps.control.services import run_create_with_taskset
from apps.control.twins import run_twins_start
from apps.feedback.training_data import EXPORT_FORMATS, ExportOptions, export_hf_dataset, export_jsonl
from apps.feedback.kinds import kind_get, kinds
from apps.feedback.selectors import feedback_effect, run_may_annotate
from kernel.input_checks import MAX_CONFIG_BYTES
from apps.rewards.models import RewardModel
from kernel.config import config_parse
from apps.runs.models import ModelVersion, Run
from apps.runs.services import run_transition
from kernel.exceptions import ExportFailed, RftError
from rftweb.exceptions import command_error
from rftweb.celery import QUEUES
from apps.feedback.ledger import REASON_WORDS, run_ledger
from apps.runs.selectors import eval_basis, eval_best, eval_measures, metric_moves
from workers.weights.adapters import model_export
from workers.reward.scorers import reward_model_export

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# What `rft export --format` once named: the file written (now `--hf` or not).
_FILE_FORMERLY = ("jsonl", "hf")

# GPU queues hold a model resident in the worker process: one process, one task at a time
# (solo pool; a forked child would re-initialise CUDA and double the memory). CPU queues
# take a prefork pool.
GPU_QUEUES = ("rollout", "train")
CPU_QUEUES = ("reward", "default")


def worker_plan(*, queues: list[str], concurrency: int | None, loglevel: str, python: str = sys.executable) -> list[list[str]]:
    """The Celery worker command lines that serve `queues`: one solo worker per GPU queue
    and one prefork worker for the CPU queues together."""
    unknown = [q for q in queues if q not in QUEUES]
    if unknown:
        raise CommandError(f"unknown queue {', '.join(map(repr, unknown))}; known queues: {', '.join(QUEUES)}")
    if not queues:
        raise CommandError("give at least one queue, e.g. --queues rollout,train")
    base = [python, "-m", "celery", "-A", "rftweb", "worker", "--loglevel", loglevel]
    plan: list[list[str]] = []
    for queue in GPU_QUEUES:
        if queue in queues:
            plan.append([*base, "--pool", "solo", "--concurrency", "1", "--queues", queue, "--hostname", f"{queue}@%h"])
    cpu = [q for q in queues if q in CPU_QUEUES]
    if cpu:
        n = concurrency or os.cpu_count() or 1
        cmd = [*base, "--pool", "prefork", "--concurrency", str(n), "--queues", ",".join(cpu),
               "--hostname", f"{'+'.join(cpu)}@%h"]
        if "default" in cpu:
            # The RFT core's loop and the housekeeping run on Celery beat: the worker of the
            # default queue runs it (run one such worker; docker-compose has its own beat).
            cmd += ["--beat", "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")]
        plan.append(cmd)
    return plan


def evaluation_arguments(parser: ArgumentParser) -> None:
    """`rft evaluation create|figures|export|close`: blind side-by-side evaluations (apps.evaluation)."""
    ev_sub = parser.add_subparsers(dest="evaluation_action", required=True, parser_class=ArgumentParser)
    ev_create = ev_sub.add_parser("create", help="ask for a blind evaluation (the workers write the answers)")
    ev_create.add_argument("run", type=int)
    ev_create.add_argument("--as", dest="actor", required=True, help="username of the run's owner (or staff)")
    ev_create.add_argument("--versions", default="", help="comma-separated version numbers, the baseline first; "
                           "RUN:N for another run's (default: 0 and the newest)")
    ev_create.add_argument("--prompts", type=int, default=20, help="how many prompts (default 20)")
    ev_create.add_argument("--prompts-file", default=None, help="a text file, one prompt a line "
                           "(default: the run's evaluation taskset)")
    ev_create.add_argument("--votes-per-pair", type=int, default=1)
    ev_create.add_argument("--voters", default="", help="comma-separated usernames (default: owner and annotators)")
    ev_create.add_argument("--seed", type=int, default=None)
    ev_create.add_argument("--placement", default="page",
                           help="page: a vote page of its own (default); between: also between the items of the "
                                "run's annotation page")
    ev_fig = ev_sub.add_parser("figures", help="an evaluation's win rates, scores and vote quality")
    ev_fig.add_argument("evaluation", type=int)
    ev_exp = ev_sub.add_parser("export", help="an evaluation's votes as JSON lines")
    ev_exp.add_argument("evaluation", type=int)
    ev_exp.add_argument("--out", required=True, help="the file to write ('-': standard output)")
    ev_close = ev_sub.add_parser("close", help="close an evaluation to votes")
    ev_close.add_argument("evaluation", type=int)
    ev_close.add_argument("--as", dest="actor", required=True)



def _figure(value: float, interval: tuple[float, float] | None) -> str:
    """A figure as `rft figures` prints it: a share with its 95% interval over the tasks."""
    return f"{value:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")

class Command(BaseCommand):
    help = "Create, control and export runs; start workers."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=ArgumentParser)

        create = sub.add_parser("create", help="create a draft run from a YAML or JSON config file")
        create.add_argument("config", help="path of the config file (.yaml, .yml or .json)")
        create.add_argument("--name", required=True)
        create.add_argument("--owner", help="username of the owner (default: the only superuser)")
        create.add_argument("--taskset", help="taskset file: .jsonl, .zip (JSONL with its pictures), .parquet or a datasets directory")
        create.add_argument("--taskset-name")
        create.add_argument("--start", action="store_true", help="start the run once created")

        for action in ("start", "pause", "resume", "stop"):
            p = sub.add_parser(action, help=f"{action} a run")
            p.add_argument("run", type=int)
            p.add_argument("--as", dest="actor", help="username recorded in the audit log")

        export = sub.add_parser("export", help="export a run's buffer for TRL")
        export.add_argument("run", type=int)
        # `--format` once named the file written (jsonl or hf; now --hf) and `--kind` the export's
        # format: both old spellings are still read, each with a one-line note (_export_format).
        # No argparse choices: those would list the old file spellings (_export_format checks).
        export.add_argument("--format", dest="export_format", metavar="{" + ",".join(EXPORT_FORMATS) + "}",
                            help=f"the export's format (required): one of {', '.join(EXPORT_FORMATS)}")
        export.add_argument("--kind", dest="kind_formerly", choices=EXPORT_FORMATS, help=SUPPRESS)
        export.add_argument("--out", required=True, help="a .jsonl file, or a directory with --hf")
        export.add_argument("--hf", action="store_true", help="write a Hugging Face datasets directory, not a JSONL file")
        export.add_argument("--min-reward", type=float)
        export.add_argument("--min-version", type=int)
        export.add_argument("--min-margin", type=float, default=0.0)
        export.add_argument("--domain")

        weights = sub.add_parser("weights", help="export a model version's weights (adapter or merged)")
        weights.add_argument("run", type=int)
        weights.add_argument("--version", type=int, help="version number (default: the run's current one)")
        weights.add_argument("--out", required=True, help="directory to write (replaced if it exists)")
        weights.add_argument("--merged", action="store_true",
                             help="full weights: a LoRA version's adapter folded into its base")

        rm = sub.add_parser("reward-model", help="export a learned reward-model version (AutoModelForSequenceClassification)")
        rm.add_argument("run", type=int)
        rm.add_argument("--version", type=int, help="version number (default: the newest)")
        rm.add_argument("--out", required=True, help="directory to write (replaced if it exists)")

        worker = sub.add_parser("worker", help="start Celery workers for the given queues")
        worker.add_argument("--queues", default="rollout,train,reward,default")
        worker.add_argument("--concurrency", type=int, help="processes of the CPU queues' prefork pool")
        worker.add_argument("--loglevel", default="INFO")
        worker.add_argument("--dry-run", action="store_true", help="print the worker command lines and exit")

        sub.add_parser("list", help="list the runs")

        figures = sub.add_parser("figures", help="a run's evaluation series, best version and where its labels went")
        figures.add_argument("run", type=int)

        evaluation_arguments(sub.add_parser("evaluation", help="blind side-by-side evaluations of a run's versions"))

        fb = sub.add_parser("feedback", help="give feedback as a person (the annotation page's services)")
        fb.add_argument("run", type=int)
        # Each kind brings its options (apps.feedback.kinds: cli_arguments).
        by_kind = fb.add_subparsers(dest="kind", required=True, metavar="KIND")
        for kind in kinds():
            if not kind.cli:
                continue
            one = by_kind.add_parser(kind.name, help=kind.cli_help or f"{kind.noun(1)} feedback")
            one.add_argument("--as", dest="actor", required=True, help="username of the person giving it")
            kind.cli_arguments(one)
            one.add_argument("--comment", default="")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, f"_{opts['action'].replace('-', '_')}")(opts)
        except RftError as exc:
            # The CLI's one translation of the error base: a message and exit status 1.
            raise command_error(exc) from None

    # --- blind evaluations (apps/evaluation; apps/cli/evaluation.py) ---------------------------

    def _evaluation(self, opts: dict[str, object]) -> None:
        evaluation_command(opts, write=self.stdout.write,
                           actor=lambda: self._user(str(opts.get("actor") or ""), required=True))

    # --- create / control -----------------------------------------------------------------

    @overload
    def _user(self, username: str | None, *, required: Literal[True]) -> User: ...
    @overload
    def _user(self, username: str | None, *, required: bool) -> User | None: ...

    def _user(self, username: str | None, *, required: bool) -> User | None:
        User = get_user_model()
        if username:
            user = User.objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"no user {username!r}")
            return user
        if not required:
            return None
        supers = list(User.objects.filter(is_superuser=True)[:2])
        if len(supers) != 1:
            raise CommandError("give --owner USERNAME (there is not exactly one superuser to default to)")
        return supers[0]

    def _create(self, opts: dict[str, Any]) -> None:
        path = Path(opts["config"])
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        try:
            with path.open("rb") as fh:
                raw = fh.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise CommandError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        try:
            config = config_parse(text=raw, filename=path.name)
        except RftError as exc:
            raise command_error(exc, what=f"{path} is not a valid run config") from None
        owner = self._user(opts["owner"], required=True)
        bar = None
        progress = None
        if opts["taskset"]:
            from tqdm import tqdm

            bar = tqdm(desc="taskset", unit="task", file=self.stderr._out, disable=None)

            def progress(done: int, total: int | None) -> None:
                bar.total = total
                bar.update(done - bar.n)
        try:
            run = run_create_with_taskset(
                name=opts["name"], owner=owner, config=config,
                taskset_path=opts["taskset"], taskset_name=opts["taskset_name"], progress=progress,
            )
        except ImportFailed as exc:
            raise command_error(exc, what="taskset") from None
        finally:
            if bar is not None:
                bar.close()
        self.stdout.write(f"created run {run.pk} “{run.name}” ({run.status})")
        if opts["start"]:
            self._transition(run.pk, "start", owner)

    def _transition(self, run_id: int, action: str, actor: User | None) -> None:
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}")
        run = run_transition(run=run, action=action, actor=actor)
        self.stdout.write(f"run {run.pk} is {run.status}")
        if action == "start":  # a twin made before its run started starts with it
            for twin in run_twins_start(run=run, actor=actor):
                self.stdout.write(f"run {twin.pk} (its twin, without people) is {twin.status}")

    def _start(self, opts: dict[str, Any]) -> None:
        self._transition(opts["run"], "start", self._user(opts["actor"], required=False))

    def _pause(self, opts: dict[str, Any]) -> None:
        self._transition(opts["run"], "pause", self._user(opts["actor"], required=False))

    def _resume(self, opts: dict[str, Any]) -> None:
        self._transition(opts["run"], "resume", self._user(opts["actor"], required=False))

    def _stop(self, opts: dict[str, Any]) -> None:
        self._transition(opts["run"], "stop", self._user(opts["actor"], required=False))

    def _list(self, opts: dict[str, Any]) -> None:
        for run in Run.objects.order_by("pk"):
            cfg = run.config
            self.stdout.write(
                f"{run.pk}\t{run.status}\t{cfg.get('algorithm')}\t{cfg.get('mode')}\tv{run.current_version}\t"
                f"step {run.train_step}\t{run.name}"
            )

    def _figures(self, opts: dict[str, Any]) -> None:
        """What the run page and its summary show, as text: each evaluation series under what it
        measures (start -> end, best), the best version and the metric that chose it, and the
        label ledger in all and per person."""
        run = Run.objects.filter(pk=opts["run"]).first()
        if run is None:
            raise CommandError(f"no run {opts['run']}")
        write = self.stdout.write
        moves = metric_moves(run=run, metrics=eval_measures(run=run))
        basis = eval_basis(run=run)
        write(f"run {run.pk} ({run.status}): held-out evaluation" + (f" on {basis['words']}" if basis else "")
              + ("" if moves else ": none recorded"))
        for m in moves:
            moved = f" (change {_figure(m.change, m.change_interval)}: {m.change_words})" if m.change_words else ""
            write(f"  {m.label} [{m.name}]: {_figure(m.start, m.start_interval)} -> {_figure(m.end, m.end_interval)}"
                  f"{moved}, best {m.best:.3f} at step {m.best_step}")
        best = eval_best(run=run)
        if best is not None:
            write(f"best version: v{best['version']}, chosen by {best['metric']} ({best['value']:.3f}; {best['how']})")
        ledger = run_ledger(run=run)
        for who, c in [("all labels", ledger.run), *ledger.people.items()]:
            reasons = "; ".join(f"{n} {REASON_WORDS[r]}" for r, n in c.unused_by.items() if n)
            write(f"{who}: {c.total} labels: {c.line()}" + (f" ({reasons})" if reasons else ""))
        for line in evaluation_figures_lines(run=run):
            write(line)

    # --- feedback -------------------------------------------------------------------------

    def _feedback(self, opts: dict[str, Any]) -> None:
        run = Run.objects.filter(pk=opts["run"]).first()
        if run is None:
            raise CommandError(f"no run {opts['run']}")
        author = self._user(opts["actor"], required=True)
        if not run_may_annotate(run=run, user=author):
            raise CommandError(f"{author.get_username()} may not give feedback on run {run.pk}")
        who = {"run": run, "author": author, "comment": opts["comment"]}
        fb = kind_get(opts["kind"]).cli_store(opts, who=who)
        self.stdout.write(f"feedback {fb.pk}: {fb.kind} {fb.value} ({feedback_effect(run=run, feedback=fb)})")

    # --- export ---------------------------------------------------------------------------

    def _export(self, opts: dict[str, Any]) -> None:
        from tqdm import tqdm

        export_format, hf = self._export_format(opts)
        run = Run.objects.filter(pk=opts["run"]).first()
        if run is None:
            raise CommandError(f"no run {opts['run']}")
        options = ExportOptions(
            min_reward=opts["min_reward"], min_version=opts["min_version"],
            domain=opts["domain"], min_margin=opts["min_margin"],
        )
        bar = tqdm(desc=f"export {export_format}", unit="row", file=self.stderr._out, disable=None)

        def progress(done: int, total: int | None) -> None:
            bar.total = total
            bar.update(done - bar.n)

        try:
            if hf:
                result = export_hf_dataset(run=run, export_format=export_format, out_dir=opts["out"], options=options,
                                           progress=progress)
            else:
                result = export_jsonl(run=run, export_format=export_format, out=opts["out"], options=options,
                                      progress=progress)
        except OSError as exc:
            raise CommandError(f"{opts['out']}: {exc.strerror or exc}") from None
        finally:
            bar.close()
        self.stdout.write(f"wrote {result.rows} {result.format} rows from {result.scanned} to {result.path}")

    def _export_format(self, opts: dict[str, object]) -> tuple[str, bool]:
        """(the export's format, whether to write a datasets directory), reading the old
        spellings too: `--kind F` (now `--format F`, which wins when both are given) and
        `--format jsonl|hf` (now no flag or `--hf`), each with a note on stderr."""
        given, formerly = opts["export_format"], opts["kind_formerly"]
        export_format = given if isinstance(given, str) else None
        hf = bool(opts["hf"])
        if export_format in _FILE_FORMERLY:
            self.stderr.write(f"note: --format {export_format} is deprecated: "
                              f"{'use --hf' if export_format == 'hf' else 'JSONL is the default'}")
            export_format, hf = None, hf or export_format == "hf"
        if isinstance(formerly, str):
            self.stderr.write("note: --kind is deprecated: use --format")
            export_format = export_format or formerly
        if export_format is None:
            raise CommandError(f"--format is required: one of {', '.join(EXPORT_FORMATS)}")
        if export_format not in EXPORT_FORMATS:
            raise CommandError(f"--format {export_format!r}: use one of {', '.join(EXPORT_FORMATS)}")
        return export_format, hf

    def _weights(self, opts: dict[str, Any]) -> None:
        run = Run.objects.filter(pk=opts["run"]).first()
        if run is None:
            raise CommandError(f"no run {opts['run']}")
        number = run.current_version if opts["version"] is None else opts["version"]
        if number == 0:
            raise CommandError(f"run {run.pk} has no trained version yet (version 0 is its base, {run.cfg.model})")
        version = ModelVersion.objects.filter(run=run, number=number).first()
        if version is None:
            raise CommandError(f"run {run.pk} has no version {number}")
        try:
            out = model_export(source=version.checkpoint, out=opts["out"], merged=opts["merged"])
        except ImportError as exc:  # a web-only install: no torch / peft (loaded by the export)
            raise CommandError(f"exporting weights needs the train extra installed ({exc})") from None
        except ExportFailed as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{opts['out']}: {exc.strerror or exc}") from None
        written = "merged weights" if opts["merged"] else "adapter"
        self.stdout.write(f"wrote version {number} of run {run.pk} ({written}) to {out}")

    def _reward_model(self, opts: dict[str, Any]) -> None:
        run = Run.objects.filter(pk=opts["run"]).first()
        if run is None:
            raise CommandError(f"no run {opts['run']}")
        versions = RewardModel.objects.filter(run=run).order_by("-version")
        rm = versions.first() if opts["version"] is None else versions.filter(version=opts["version"]).first()
        if rm is None:
            raise CommandError(f"run {run.pk} has no reward model yet (feedback.reward_model: it trains as labels come in)"
                               if opts["version"] is None else f"run {run.pk} has no reward model version {opts['version']}")
        try:
            out = reward_model_export(source=rm.path, out=opts["out"], scale=rm.scale, offset=rm.offset)
        except ImportError as exc:  # a web-only install: no torch / transformers (loaded by the export)
            raise CommandError(f"exporting a reward model needs the train extra installed ({exc})") from None
        except ExportFailed as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{opts['out']}: {exc.strerror or exc}") from None
        self.stdout.write(f"wrote reward model v{rm.version} of run {run.pk} (held-out accuracy "
                          f"{'n/a' if rm.accuracy is None else f'{rm.accuracy:.3f}'} on {rm.pairs_heldout} pairs; "
                          f"on the random share {'n/a' if rm.accuracy_random is None else f'{rm.accuracy_random:.3f}'}"
                          f" on {rm.pairs_random or 0}) to {out}")

    # --- workers --------------------------------------------------------------------------

    def _worker(self, opts: dict[str, Any]) -> None:
        queues = [q.strip() for q in opts["queues"].split(",") if q.strip()]
        plan = worker_plan(queues=queues, concurrency=opts["concurrency"], loglevel=opts["loglevel"])
        if opts["dry_run"]:
            for cmd in plan:
                self.stdout.write(" ".join(cmd))
            return
        procs = [subprocess.Popen(cmd) for cmd in plan]
        self.stderr.write(f"started {len(procs)} worker process(es): " + ", ".join(str(p.pid) for p in procs))

        def forward(signum: int, _frame: FrameType | None) -> None:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, forward)
        # Workers stand together: when one exits, the others are stopped (warm shutdown)
        # so a supervisor sees the failure and restarts the whole set.
        code = 0
        remaining = list(procs)
        while remaining:
            done = [p for p in remaining if p.poll() is not None]
            if not done:
                try:
                    remaining[0].wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
                continue
            for p in done:
                remaining.remove(p)
                code = code or p.returncode
            for p in remaining:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
        if code not in (0, -signal.SIGTERM, -signal.SIGINT):
            raise CommandError(f"a worker exited with status {code}")
