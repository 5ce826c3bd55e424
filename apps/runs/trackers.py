"""Experiment trackers: TensorBoard, MLflow and Weights & Biases, each optional.

Every metric `metric_record` stores (explorer, trainer, evaluation, pipelines) also goes to
the trackers a run asks for (its config's `tracking`) and those the deployment turns on for
every run (`RFT_TRACKERS`), once the metric's transaction commits. Each rftweb run is one
tracker run, whichever process logs to it:

- TensorBoard: one log directory per run, `RFT_TRACKING_DIR/tensorboard/run-<id>`; each
  process writes its own event file there and TensorBoard reads them as one run.
- MLflow: experiment `rftweb`, one run tagged `rftweb.run_id` (found, or created under a row
  lock on the rftweb run so two processes cannot both create it); a file store under
  `RFT_TRACKING_DIR/mlruns` unless `RFT_MLFLOW_URI` names a server.
- wandb: run id `rftweb-<id>` in `RFT_WANDB_PROJECT`, resumed by every process; offline by
  default (`RFT_WANDB_MODE`), files under `RFT_TRACKING_DIR/wandb`, uploaded by `wandb sync`.

A tracker that fails (package missing, server away) is logged once and switched off for
that run in this process: tracking never fails a step. The packages are the `tracking` extra;
none of them is imported until a run uses it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from django.conf import settings
from django.db import transaction
from apps.runs.models import Run

if TYPE_CHECKING:
    from apps.runs.models import Run

log = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "mlflow", "wandb")


class Tracker(Protocol):
    def log(self, *, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def tracking_dir() -> Path:
    return Path(settings.RFT_TRACKING_DIR)


def tensorboard_dir(run_id: int) -> Path:
    return tracking_dir() / "tensorboard" / f"run-{run_id}"


def mlflow_uri() -> str:
    return settings.RFT_MLFLOW_URI or (tracking_dir() / "mlruns").resolve().as_uri()


def wandb_run_id(run_id: int) -> str:
    return f"rftweb-{run_id}"


class TensorBoardTracker:
    def __init__(self, run: Run) -> None:
        # tensorboard's own writer: no torch needed, so web processes can log too.
        from tensorboard.summary import Writer

        path = tensorboard_dir(run.pk)
        path.mkdir(parents=True, exist_ok=True)
        self.writer = Writer(str(path))

    def log(self, *, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    EXPERIMENT = "rftweb"

    def __init__(self, run: Run) -> None:
        import os

        from mlflow.tracking import MlflowClient


        uri = mlflow_uri()
        if uri.startswith("file:"):
            # MLflow 3 refuses its file store unless told (it wants a database or a
            # server); a file store on shared storage is what a deployment without an
            # MLflow server has. RFT_MLFLOW_URI names a server to use one.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(self.EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(self.EXPERIMENT)
        query = f"tags.`rftweb.run_id` = '{int(run.pk)}'"
        with transaction.atomic():
            # One creator at a time per rftweb run; the others then find its tracker run.
            Run.objects.select_for_update().filter(pk=run.pk).exists()
            found = self.client.search_runs([experiment_id], filter_string=query, max_results=1)
            if found:
                self.run_id = found[0].info.run_id
            else:
                created = self.client.create_run(
                    experiment_id, run_name=f"{run.name} (#{run.pk})",
                    tags={"rftweb.run_id": str(run.pk), "rftweb.model": str(run.cfg.model)},
                )
                self.run_id = created.info.run_id
                for key, value in _flat_params(run.config).items():
                    self.client.log_param(self.run_id, key, value)

    def log(self, *, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric as MlflowMetric

        now = int(time.time() * 1000)
        # MLflow keys allow / but not every character: names are ours, already plain.
        metrics = [MlflowMetric(key=name, value=value, timestamp=now, step=step) for name, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        pass


class WandbTracker:
    def __init__(self, run: Run) -> None:
        import wandb

        path = tracking_dir() / "wandb"
        path.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=settings.RFT_WANDB_PROJECT, id=wandb_run_id(run.pk), name=f"{run.name} (#{run.pk})",
            resume="allow", dir=str(path), mode=settings.RFT_WANDB_MODE,  # type: ignore[arg-type]  # one of wandb's modes (settings.py) config=run.config,
            reinit="create_new", settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log(self, *, step: int, values: dict[str, float]) -> None:
        # Steps come from several processes out of order; wandb's own step must only grow,
        # so ours goes in as a metric and the x axis of every chart.
        self.run.log({**values, "rftweb_step": step})

    def close(self) -> None:
        self.run.finish()


def _flat_params(config: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat_params(value, f"{name}."))
        else:
            out[name] = str(value)[:500]
    return out


_KINDS: dict[str, type] = {"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker, "wandb": WandbTracker}
_OPEN: dict[tuple[int, str], Tracker | None] = {}
_LOCK = threading.Lock()


def trackers_for(run: Run) -> list[str]:
    """The trackers `run` logs to: its config's `tracking` plus the deployment's."""
    names = list(getattr(run.cfg, "tracking", [])) + list(settings.RFT_TRACKERS)
    return [n for n in TRACKERS if n in names]


def _tracker(run: Run, kind: str) -> Tracker | None:
    key = (run.pk, kind)
    with _LOCK:
        if key in _OPEN:
            return _OPEN[key]
    try:
        tracker: Tracker | None = _KINDS[kind](run)
    except Exception:
        log.warning("run %s: the %s tracker could not start; it is off for this run in this process",
                    run.pk, kind, exc_info=True)
        tracker = None
    with _LOCK:
        _OPEN.setdefault(key, tracker)
        return _OPEN[key]


def trackers_log(*, run: Run, step: int, values: dict[str, float]) -> None:
    """Log one step's metrics to the run's trackers now (callers use `trackers_log_on_commit`)."""
    for kind in trackers_for(run):
        tracker = _tracker(run, kind)
        if tracker is None:
            continue
        try:
            tracker.log(step=step, values=values)
        except Exception:
            log.warning("run %s: the %s tracker failed; it is off for this run in this process", run.pk, kind, exc_info=True)
            with _LOCK:
                _OPEN[(run.pk, kind)] = None


def trackers_log_on_commit(*, run: Run, step: int, values: dict[str, float]) -> None:
    """What `metric_record` calls: nothing for a run without trackers, else log once the
    metrics are committed (a rolled-back step never reaches a tracker)."""
    if not values or not trackers_for(run):
        return
    transaction.on_commit(lambda: trackers_log(run=run, step=step, values=dict(values)))


def trackers_close(run_id: int | None = None) -> None:
    """Flush and close this process's trackers (of one run, or all)."""
    with _LOCK:
        keys = [k for k in _OPEN if run_id is None or k[0] == run_id]
        trackers = [_OPEN.pop(k) for k in keys]
    for tracker in trackers:
        if tracker is not None:
            try:
                tracker.close()
            except Exception:
                log.warning("a tracker did not close cleanly", exc_info=True)
