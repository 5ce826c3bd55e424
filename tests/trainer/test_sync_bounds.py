"""Syncs never hang (issue 66.3): every weight sync and handover is bounded by the run's
`sync_timeout_s`; one that stalls or fails raises SyncFailed naming the method, the stage,
the path or group and the process, and the run page's weight-sync timeline shows it
(apps.runs.services.sync_failure_record). One test per method: checkpoint, in-memory,
adapter; NCCL's protocol over gloo in test_sync_bounds_gloo.py (tests/gpu for NCCL itself)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils.html import escape

from apps.runs.models import ModelVersion, Run, SyncFailure
from apps.runs.ports import model_version_publish, run_view_of
from tests.factories import make_run
from workers.weights import sync as sync_mod
from workers.engines import engine_cache_clear, engine_cached, engine_for
from workers.weights.handover import handover_clear
from workers.weights.sync import SyncFailed, version_dir

pytestmark = pytest.mark.django_db

BOUND = 0.5  # the runs' sync_timeout_s here
SLACK = 10.0  # a loaded 2-core host may start the waiting thread late; never near a hang


@pytest.fixture(autouse=True)
def _fresh(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    engine_cache_clear()
    handover_clear()
    yield
    engine_cache_clear()


@pytest.fixture
def stall() -> Iterator[threading.Event]:
    """Set to let a stalled write go on; set at the end whatever happens."""
    go = threading.Event()
    yield go
    go.set()


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """The live events the runs app's services publish (the real publish still runs)."""
    from apps.runs import services
    from apps.runs.events import event_publish as publish

    sent: list[tuple[str, dict[str, Any]]] = []

    def recorded(*, run_id: int, type: str, payload: dict[str, Any]) -> Any:
        sent.append((type, payload))
        return publish(run_id=run_id, type=type, payload=payload)

    monkeypatch.setattr(services, "event_publish", recorded)
    return sent


def _resident(run: Run, model: Any, tokenizer: Any, step: int = 1) -> Any:
    from workers.trainer.resident import Resident

    return Resident(run_id=run.pk, config_key="", step=step, model=model, tokenizer=tokenizer, ref_model=None,
                    learner=None)  # type: ignore[arg-type]  # publishing reads no learner


def _on_the_timeline(run: Run, owner: User, *, version: int, said: list[str],
                     events: list[tuple[str, dict[str, Any]]]) -> None:
    """The failure is a row, its live event went out, and the run page says it, its
    versions' table open."""
    failure = SyncFailure.objects.get(run=run, version=version)
    assert [p for t, p in events if t == "weights.synced" and p.get("event") == "failed" and p["version"] == version]
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert '<details class="sync-table" open>' in page
    panel = client.get(f"/runs/{run.pk}/timeline/").content.decode()
    for text in said + [f"{failure.method} {failure.stage} failed", failure.worker, failure.message]:
        assert escape(text) in page and escape(text) in panel, text


def _raises_within(call: Any) -> tuple[SyncFailed, float]:
    started = time.monotonic()
    with pytest.raises(SyncFailed) as caught:
        call()
    took = time.monotonic() - started
    assert BOUND * 0.9 <= took < BOUND + SLACK, took
    return caught.value, took


def test_a_checkpoint_write_that_stalls_fails_within_the_bound_and_never_lands(
    owner: User, tiny_model_dir: Path, load_model: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch,
    stall: threading.Event, events: list[tuple[str, dict[str, Any]]],
) -> None:
    from workers.trainer.step import publish_due

    real = sync_mod.save_pretrained_atomic
    ended = threading.Event()
    outcome: list[str] = []

    def stalled(**kw: Any) -> Path:  # storage that stops answering, then answers late
        try:
            stall.wait(60)
            return real(**kw)
        except Exception as exc:
            outcome.append(str(exc))
            raise
        finally:
            ended.set()

    monkeypatch.setattr(sync_mod, "save_pretrained_atomic", stalled)
    run = make_run(owner=owner, model=str(tiny_model_dir), sync_timeout_s=BOUND)
    out = version_dir(run.pk, 1)
    failed, _ = _raises_within(lambda: publish_due(run=run_view_of(run), res=_resident(run, load_model(), tokenizer)))
    assert (failed.method, failed.stage, failed.version, failed.where) == ("checkpoint", "write", 1, str(out))
    assert f"checkpoint sync of run {run.pk} version 1: write at {out} failed on " in str(failed)
    assert f"sync_timeout_s ({BOUND:g} s)" in str(failed)
    assert not ModelVersion.objects.filter(run=run, number=1).exists()
    _on_the_timeline(run, owner, version=1, said=[str(out), "not published"], events=events)
    # The write left behind finishes late: it never replaces the version a retry may have written.
    stall.set()
    assert ended.wait(60)
    assert outcome and "discarded" in outcome[0]
    assert not out.exists() and not list(out.parent.glob(".v1.tmp-*"))


def test_a_checkpoint_not_on_the_explorers_disk_fails_after_the_bound_naming_the_path(
    owner: User, tiny_model_dir: Path, events: list[tuple[str, dict[str, Any]]],
) -> None:
    """The trainer wrote it, the explorer's host does not see it (storage not shared): the
    explorer waits while the bound allows, then fails instead of waiting for ever."""
    from workers.explore.explorer import VersionNotReady, engine_at

    run = make_run(owner=owner, model=str(tiny_model_dir), sync_timeout_s=30.0)
    missing = version_dir(run.pk, 1)
    model_version_publish(run=run_view_of(run), number=1, checkpoint=str(missing), train_step=1)
    with pytest.raises(VersionNotReady):
        engine_at(run=run_view_of(run), version=1, worker="explorer@test")
    ModelVersion.objects.filter(run=run, number=1).update(created_at=ModelVersion.objects.get(
        run=run, number=1).created_at - timedelta(seconds=31))
    with pytest.raises(SyncFailed) as caught:
        engine_at(run=run_view_of(run), version=1, worker="explorer@test")
    failed = caught.value
    assert (failed.method, failed.stage, failed.where) == ("checkpoint", "find the checkpoint", str(missing))
    assert "RFT_STORAGE_DIR" in failed.cause and "sync_timeout_s is 30 s" in failed.cause
    _on_the_timeline(run, owner, version=1, said=[str(missing), "RFT_STORAGE_DIR"], events=events)


def test_an_adapter_version_whose_file_is_corrupt_fails_its_load_naming_the_adapter(
    owner: User, tiny_model_dir: Path, load_model: Any, events: list[tuple[str, dict[str, Any]]],
) -> None:
    from kernel.config import AdapterConfig
    from workers.weights.adapters import adapter_save, adapter_wrap
    from workers.explore.explorer import engine_at

    run = make_run(owner=owner, model=str(tiny_model_dir), sync_timeout_s=BOUND)
    out = version_dir(run.pk, 1)
    model = adapter_wrap(model=load_model(), lora=AdapterConfig(rank=4, target_modules=["q_proj", "v_proj"]))
    adapter_save(model=model, out=out)
    (out / "adapter_model.safetensors").write_bytes(b"\x00" * 64)  # torn on the way
    model_version_publish(run=run_view_of(run), number=1, checkpoint=str(out), train_step=1)
    with pytest.raises(SyncFailed) as caught:
        engine_at(run=run_view_of(run), version=1, worker="explorer@test")
    failed = caught.value
    assert (failed.method, failed.stage, failed.where, failed.worker) == ("adapter", "load", str(out), "explorer@test")
    assert failed.seconds < BOUND + SLACK
    # The engine's weights are unknown after a failed load: the next step builds it afresh.
    assert not engine_cached(run.cfg)
    _on_the_timeline(run, owner, version=1, said=[str(out), "adapter load failed"], events=events)


def test_an_in_memory_handover_whose_write_stalls_fails_the_next_publish_within_the_bound(
    owner: User, tiny_model_dir: Path, load_model: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch,
    stall: threading.Event, events: list[tuple[str, dict[str, Any]]], settings: Any,
) -> None:
    from workers.weights import handover
    from workers.trainer.step import publish_due

    settings.RFT_WEIGHT_SYNC = "checkpoint"
    real = handover._write

    def stalled(**kw: Any) -> Path:
        stall.wait(60)
        return real(**kw)

    monkeypatch.setattr(handover, "_write", stalled)
    run = make_run(owner=owner, model=str(tiny_model_dir), sync_timeout_s=BOUND)
    engine_for(run.cfg)  # this process explores too: the handover applies
    model = load_model()
    assert publish_due(run=run_view_of(run), res=_resident(run, model, tokenizer, step=1)) is not None
    run.refresh_from_db()
    assert run.current_version == 1  # recorded at once; its files are still being written
    first = version_dir(run.pk, 1)
    failed, _ = _raises_within(lambda: publish_due(run=run_view_of(run), res=_resident(run, model, tokenizer, step=2)))
    assert (failed.method, failed.version, failed.where) == ("memory", 2, str(first))
    assert failed.stage == "wait for the previous version's write"
    assert "did not finish within the run's sync_timeout_s" in failed.cause
    _on_the_timeline(run, owner, version=2, said=[str(first)], events=events)
    stall.set()
    handover.pending_wait()
    assert first.exists()


def test_a_receiver_that_fails_mid_version_records_it_on_the_timeline(
    owner: User, tiny_model_dir: Path, events: list[tuple[str, dict[str, Any]]],
) -> None:
    """An explorer's receiver thread (NcclSync) that fails mid-version keeps the failure, and
    the explorer's next step puts it on the run's timeline (its engine loads checkpoints)."""
    from workers.explore.explorer import engine_at
    from workers.weights.sync import SyncReceiver, receiver_install

    run = make_run(owner=owner, model=str(tiny_model_dir))

    class Lost:
        name = "nccl"

        def receive(self) -> Any:
            raise SyncFailed(method="nccl", stage="receive", run_id=run.pk, version=3, where="gloo group tcp://h:1 "
                             "(rank 1 of 2)", worker="explorer-host:7", seconds=0.5, cause="RuntimeError: timed out")

    receiver = SyncReceiver(Lost(), limit=5).start()  # type: ignore[arg-type]  # the receive side only
    receiver_install(receiver)
    try:
        receiver._thread.join(30)
        assert not receiver._thread.is_alive() and receiver.received == 0
        # The explorer's next step notes it (its engine then loads the checkpoint).
        engine_at(run=run_view_of(run), version=0, worker="explorer@test")
    finally:
        receiver_install(None)
    _on_the_timeline(run, owner, version=3, said=["gloo group tcp://h:1 (rank 1 of 2)", "nccl receive failed"],
                     events=events)


def test_a_failed_publish_is_retried_by_the_loop_and_fails_the_run_only_when_it_keeps_failing(
    owner: User, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, settings: Any,
) -> None:
    """The train task does not fail the run on the first SyncFailed (the re-dispatched step
    publishes again); it counts it, and one that keeps failing fails the run with the message."""
    from workers.trainer import task as task_mod

    settings.RFT_RUN_FAIL_AFTER = 2
    run = make_run(owner=owner, model=str(tiny_model_dir))
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    failed = SyncFailed(method="checkpoint", stage="write", run_id=run.pk, version=1, where="/shared/v1",
                        worker="trainer-host:9", seconds=0.5, cause="no answer within the run's sync_timeout_s (0.5 s)")

    def publishing(**_: Any) -> Any:
        raise failed

    monkeypatch.setattr(task_mod, "trainer_step", publishing)
    first = task_mod.train_step.apply(args=[run.pk, 1]).get()
    assert first["status"] == "sync failed" and "/shared/v1" in first["error"]
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    task_mod.train_step.apply(args=[run.pk, 1]).get()
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "SyncFailed" in run.error and "checkpoint sync of run" in run.error and "/shared/v1" in run.error
