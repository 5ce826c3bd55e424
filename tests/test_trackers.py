"""Experiment trackers, offline: after a short run the TensorBoard event files, the MLflow
file store and wandb's offline run hold every metric the run recorded (trainer steps,
explorer and evaluation metrics alike), one tracker run per rftweb run."""

from __future__ import annotations

import glob
import struct
from pathlib import Path
from typing import Any

import pytest

from apps.runs.metrics import metric_record
from apps.runs.trackers import mlflow_uri, tensorboard_dir, trackers_close, trackers_for
from tests.factories import make_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _tracking(settings: Any, tmp_path: Path) -> Any:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    settings.RFT_TRACKING_DIR = tmp_path / "tracking"
    settings.RFT_MLFLOW_URI = ""
    settings.RFT_WANDB_MODE = "offline"
    settings.RFT_TRACKERS = []
    trackers_close()
    yield
    trackers_close()


def tensorboard_scalars(path: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(path))
    acc.Reload()
    return {tag: {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}
            for tag in acc.Tags()["tensors"]}


def mlflow_metrics(run_pk: int) -> dict[str, dict[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri())
    experiment = client.get_experiment_by_name("rftweb")
    assert experiment is not None, "the tracker made no 'rftweb' experiment"
    found = client.search_runs([experiment.experiment_id], filter_string=f"tags.`rftweb.run_id` = '{run_pk}'")
    assert len(found) == 1, "one MLflow run per rftweb run"
    run_id = found[0].info.run_id
    return {key: {m.step: m.value for m in client.get_metric_history(run_id, key)} for key in found[0].data.metrics}


def wandb_history(root: Path) -> list[dict[str, str]]:
    """History rows of wandb's offline run files (a LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in glob.glob(str(root / "wandb" / "offline-run-*" / "*.wandb")):
        data = Path(path).read_bytes()
        assert data[:4] == b":W&B"
        pos, buf = 7, b""
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if kind == 0 and length == 0:
                break
            chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
            buf = chunk if kind in (1, 2) else buf + chunk
            if kind in (1, 4):
                record = pb.Record()  # type: ignore[attr-defined]  # protobuf's generated class
                record.ParseFromString(buf)
                if record.WhichOneof("record_type") == "history":
                    rows.append({item.key or "/".join(item.nested_key): item.value_json for item in record.history.item})
    return rows


def test_every_metric_of_a_run_reaches_tensorboard_mlflow_and_wandb_offline(
    owner: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    run = make_run(owner=owner, tracking=["tensorboard", "mlflow", "wandb"])
    other = make_run(owner=owner)  # no trackers
    assert trackers_for(run) == ["tensorboard", "mlflow", "wandb"] and trackers_for(other) == []
    steps = {1: {"loss": 0.75, "explore/reward_mean": 0.25}, 2: {"loss": 0.5, "kl": 0.01}, 3: {"eval/reward_mean": 0.6}}
    with django_capture_on_commit_callbacks(execute=True):
        for step, values in steps.items():
            metric_record(run=run, step=step, values=values)
        metric_record(run=other, step=1, values={"loss": 9.0})
    trackers_close()

    tb = tensorboard_scalars(tensorboard_dir(run.pk))
    assert tb["loss"] == {1: 0.75, 2: 0.5} and tb["eval/reward_mean"] == {3: pytest.approx(0.6)}
    assert tb["explore/reward_mean"] == {1: 0.25} and tb["kl"] == {2: pytest.approx(0.01)}
    assert not tensorboard_dir(other.pk).exists()

    ml = mlflow_metrics(run.pk)
    assert ml["loss"] == {1: 0.75, 2: 0.5} and ml["eval/reward_mean"] == {3: 0.6} and ml["kl"] == {2: 0.01}

    rows = wandb_history(Path(settings.RFT_TRACKING_DIR) / "wandb")
    logged = {(int(r["rftweb_step"]), k): float(v) for r in rows if "rftweb_step" in r
              for k, v in r.items() if not k.startswith("_") and k != "rftweb_step"}
    assert logged == {(s, k): v for s, vals in steps.items() for k, v in vals.items()}


def test_the_deployment_can_turn_a_tracker_on_for_every_run(owner: Any, settings: Any,
                                                            django_capture_on_commit_callbacks: Any) -> None:
    settings.RFT_TRACKERS = ["tensorboard"]
    run = make_run(owner=owner)
    with django_capture_on_commit_callbacks(execute=True):
        metric_record(run=run, step=4, values={"loss": 0.125})
    trackers_close()
    assert tensorboard_scalars(tensorboard_dir(run.pk))["loss"] == {4: 0.125}


def test_a_tracker_that_cannot_start_is_skipped_and_the_metrics_still_land(
    owner: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any, caplog: Any
) -> None:
    from apps.runs import trackers
    from apps.runs.models import Metric

    def missing(run: Any) -> None:
        raise ImportError("No module named 'mlflow'")

    monkeypatch.setitem(trackers._KINDS, "mlflow", missing)
    run = make_run(owner=owner, tracking=["mlflow", "tensorboard"])
    with django_capture_on_commit_callbacks(execute=True):
        metric_record(run=run, step=1, values={"loss": 1.0})
        metric_record(run=run, step=2, values={"loss": 0.5})
    trackers_close()
    assert Metric.objects.filter(run=run, name="loss").count() == 2
    assert tensorboard_scalars(tensorboard_dir(run.pk))["loss"] == {1: 1.0, 2: 0.5}
    assert sum("mlflow tracker could not start" in r.getMessage() for r in caplog.records) == 1


def test_a_run_config_names_only_known_trackers() -> None:
    from kernel.config import ConfigInvalid, config_validate

    with pytest.raises(ConfigInvalid) as exc:
        config_validate(data={"model": "m", "tracking": ["tensorboard", "neptune"]})
    assert any(field.startswith("tracking") for field in exc.value.errors)


def test_a_reward_model_and_a_k12_grader_accuracy_reach_the_trackers_and_the_live_chart(
    owner: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    """Both publishers once wrote the metric row alone and sent their live event under
    `metrics`, a key the run page's chart does not read: the page showed the accuracy only
    after a reload and no tracker ever got it."""
    from apps.rewards.k12_rules import k12_grader_publish
    from apps.feedback.reward_model.versions import reward_model_publish
    from apps.runs import metrics
    from apps.runs.events import event_publish as real

    sent: list[dict[str, Any]] = []
    def publish(**kw: Any) -> Any:
        sent.append(kw)
        return real(**kw)

    monkeypatch.setattr(metrics, "event_publish", publish)
    run = make_run(owner=owner, tracking=["tensorboard"])
    with django_capture_on_commit_callbacks(execute=True):
        reward_model_publish(run=run, path="/rm/1", base="demo", accuracy=0.875, pairs_train=40,
                             pairs_heldout=20, labels=60, seconds=1.0)
        k12_grader_publish(run=run, path="/k12/1", base="demo", accuracy=0.75, pairs_train=10,
                           pairs_heldout=5, grades=12, seconds=1.0, scale=1.0, offset=0.5)
    trackers_close()
    tb = tensorboard_scalars(tensorboard_dir(run.pk))
    assert tb["reward_model/accuracy"] == {1: 0.875}
    assert any(name.startswith("k12") and values == {1: 0.75} for name, values in tb.items())
    # The chart (static/rftweb/dashboard.js) puts `payload.values` of each run.metric event.
    assert [e["payload"]["values"] for e in sent if e["type"] == "run.metric"] == [
        {"reward_model/accuracy": 0.875}, {next(n for n in tb if n.startswith("k12")): 0.75}]
