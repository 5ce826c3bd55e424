"""The trainer step against real Postgres: claims, acks, releases, checkpoints, versions,
metrics, restarts. The task body runs in this process (the Celery path is in test_modes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.kinds.pairwise import feedback_compare
from apps.runs.models import Metric, ModelVersion, Run
from tests.factories import experience_row
from tests.trainer.conftest import running_run
from workers.trainer import resident as trainer_resident, step as step_module, task as trainer_task
from workers.trainer.step import trainer_step

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> Iterator[Path]:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_resident.RESIDENTS.clear()
    yield settings.RFT_STORAGE_DIR
    trainer_resident.RESIDENTS.clear()


def _groups(run: Run, *, groups: int = 2, size: int = 4, version: int = 0, tag: str = "", **fields: Any) -> list[int]:
    rows = []
    for g in range(groups):
        for i in range(size):
            rows.append(experience_row(
                run, key=f"{tag}v{version}g{g}-{i}", group=f"{tag}v{version}g{g}", prompt_len=3 + g, response_len=2 + i,
                reward=float(i % 2), model_version=version, **fields,
            ))
    return experience_write(experiences=rows).ids


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_a_step_trains_acks_the_batch_publishes_a_version_and_records_metrics(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir)
    ids = _groups(run)
    out = trainer_step(run_id=run.pk, step=1)
    assert out["status"] == "trained" and out["published"]
    run.refresh_from_db()
    assert run.train_step == 1 and run.current_version == 1
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"consumed"}
    version = ModelVersion.objects.get(run=run, number=1)
    checkpoint = Path(version.checkpoint)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in checkpoint.iterdir()}
    v0, v1 = _weights(tiny_model_dir), _weights(checkpoint)
    assert any(not torch.equal(v0[k], v1[k]) for k in v0)
    names = set(Metric.objects.filter(run=run, step=1).values_list("name", flat=True))
    assert {"loss", "reward_mean", "reward_std", "entropy", "clip_fraction", "response_length",
            "tokens_per_second", "staleness", "step_seconds", "sync_seconds", "train/skipped_no_signal"} <= names


def test_the_same_step_twice_trains_once(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir)
    _groups(run)
    _groups(run, tag="more")
    assert trainer_step(run_id=run.pk, step=1)["status"] == "trained"
    assert trainer_step(run_id=run.pk, step=1)["status"] == "done"
    run.refresh_from_db()
    assert run.train_step == 1
    assert Experience.objects.filter(run=run, status="ready").count() == 8
    assert Metric.objects.filter(run=run, name="loss").count() == 1


def test_a_failed_step_hands_its_batch_back(owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = running_run(owner, tiny_model_dir)
    ids = _groups(run)

    def boom(self: Any, batch: Any) -> None:
        raise RuntimeError("device lost")

    monkeypatch.setattr("workers.algorithms.learner.Learner.step", boom)
    with pytest.raises(RuntimeError, match="device lost"):
        trainer_step(run_id=run.pk, step=1)
    run.refresh_from_db()
    assert run.train_step == 0
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", "use_count")) == {("ready", 0)}


def test_a_trainer_whose_earlier_try_could_not_hand_its_batch_back_trains_on_it_next(owner: Any, tiny_model_dir: Path) -> None:
    """Postgres went away mid-step: the claim had committed, the release on the way out could
    not. The trainer's next try takes the batch back at once instead of waiting the lease out."""
    from apps.buffer.services import batch_claim

    run = running_run(owner, tiny_model_dir)
    ids = _groups(run)
    assert len(batch_claim(run=run, worker="trainer-1", size=8)) == 8  # the try that died
    assert trainer_step(run_id=run.pk, step=1, worker="trainer-1")["status"] == "trained"
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", "lease_owner")) == {("consumed", "")}


def test_a_trainer_hands_an_earlier_try_s_leases_back_even_when_another_batch_is_ready(
    owner: Any, tiny_model_dir: Path,
) -> None:
    """The same with two batches in the buffer: the step's claim could take the other one, and
    the dead try's leases stayed out until they expired (a run cannot end while any is leased)."""
    from apps.buffer.services import batch_claim

    run = running_run(owner, tiny_model_dir)
    ids = _groups(run) + _groups(run, tag="b")
    assert len(batch_claim(run=run, worker="trainer-1", size=8)) == 8  # the try that died
    assert trainer_step(run_id=run.pk, step=1, worker="trainer-1")["status"] == "trained"
    assert not Experience.objects.filter(pk__in=ids, status="leased").exists()
    # One batch trained on, the other back in the buffer (the claim need not take the stale one).
    assert Experience.objects.filter(pk__in=ids, status="consumed").count() == 8
    assert Experience.objects.filter(pk__in=ids, status="ready").count() == 8


def test_a_step_that_cannot_train_fails_the_run_through_its_lifecycle_with_an_audit_entry(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.runs.models import AuditEntry
    from workers.trainer.task import train_step

    run = running_run(owner, tiny_model_dir)
    ids = _groups(run)

    def bad_shapes(self: Any, batch: Any) -> None:
        raise ValueError("logits and labels differ in shape")

    monkeypatch.setattr("workers.algorithms.learner.Learner.step", bad_shapes)
    # The Celery task's body, in this process: a retry would only repeat this error.
    out = train_step.apply(args=[run.pk, 1]).get()
    assert out["status"] == "failed"
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "train step 1" in run.error and "ValueError: logits and labels differ in shape" in run.error
    entry = AuditEntry.objects.get(run=run, action="fail")
    assert entry.actor is None and "logits and labels differ" in entry.detail["reason"]
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"ready"}
    # A second failure report (another worker) leaves the run and its audit as they are.
    trainer_task.run_fail(run.pk, 1, RuntimeError("later error"))
    run.refresh_from_db()
    assert "later error" not in run.error and AuditEntry.objects.filter(run=run, action="fail").count() == 1


def test_a_paused_run_is_not_trained(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir)
    _groups(run)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.PAUSED)
    assert trainer_step(run_id=run.pk, step=1)["status"] == "not running"
    assert Experience.objects.filter(run=run, status="ready").count() == 8


def test_a_restarted_trainer_continues_exactly_where_it_stopped(owner: Any, tiny_model_dir: Path) -> None:
    """Same data, two runs: one trainer process throughout, and one whose resident model and
    optimizer are forgotten between steps (a worker restart). Same weights at the end,
    so the optimizer state came back too (Adam's second step depends on it)."""
    runs = []
    for restart in (False, True):
        run = running_run(owner, tiny_model_dir, name=f"restart={restart}")
        _groups(run, version=0, tag="a")
        _groups(run, version=0, tag="b")
        assert trainer_step(run_id=run.pk, step=1)["status"] == "trained"
        if restart:
            trainer_resident.RESIDENTS.clear()
        assert trainer_step(run_id=run.pk, step=2)["status"] == "trained"
        runs.append(run)
    a, b = (_weights(Path(ModelVersion.objects.get(run=r, number=2).checkpoint)) for r in runs)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-6)


def test_sync_mode_never_trains_on_experiences_of_an_older_version(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir, mode="sync", sync_interval=1, sync_offset=0)
    ModelVersion.objects.create(run=run, number=1, checkpoint=str(tiny_model_dir))
    Run.objects.filter(pk=run.pk).update(train_step=1, current_version=1)
    # the trainer state of step 1 is v0's weights here (a fresh optimizer is fine for this test)
    stale = _groups(run, version=0, tag="old")
    fresh = _groups(run, version=1, tag="new")
    assert trainer_step(run_id=run.pk, step=2)["status"] == "trained"
    assert set(Experience.objects.filter(pk__in=fresh).values_list("status", flat=True)) == {"consumed"}
    assert set(Experience.objects.filter(pk__in=stale).values_list("status", flat=True)) == {"ready"}
    assert Metric.objects.get(run=run, step=2, name="staleness").value == 0


def test_async_mode_claims_within_max_staleness_only(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir, mode="async", max_staleness=1, train_batch_size=16)
    Run.objects.filter(pk=run.pk).update(train_step=3, current_version=3)
    too_old = _groups(run, version=1, tag="x")
    within = _groups(run, version=2, tag="y") + _groups(run, version=3, tag="z")
    assert trainer_step(run_id=run.pk, step=4)["status"] == "trained"
    assert set(Experience.objects.filter(pk__in=within).values_list("status", flat=True)) == {"consumed"}
    assert set(Experience.objects.filter(pk__in=too_old).values_list("status", flat=True)) == {"ready"}
    assert Metric.objects.get(run=run, step=4, name="staleness").value == 1


def test_versions_are_published_every_sync_interval_steps(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir, sync_interval=2)
    for tag in "abc":
        _groups(run, tag=tag)
    for step in (1, 2, 3):
        assert trainer_step(run_id=run.pk, step=step)["status"] == "trained"
    assert list(ModelVersion.objects.filter(run=run, number__gte=1).values_list("number", "train_step")) == [(1, 2)]
    run.refresh_from_db()
    assert run.current_version == 1


def test_mix_claims_its_expert_share_and_trains_on_both(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir, algorithm="mix", train_batch_size=8,
                       trainer={"learning_rate": 1e-3, "mu": 0.5, "expert_share": 0.25})
    usual = _groups(run, groups=2)
    expert = experience_write(experiences=[
        experience_row(run, key=f"x{i}", group=f"x{i}", is_expert=True, source="human", reward=None) for i in range(4)
    ]).ids
    assert trainer_step(run_id=run.pk, step=1)["status"] == "trained"
    consumed = set(Experience.objects.filter(run=run, status="consumed").values_list("pk", flat=True))
    assert len(consumed & set(expert)) == 2 and len(consumed & set(usual)) == 4
    names = set(Metric.objects.filter(run=run, step=1).values_list("name", flat=True))
    assert {"grpo_loss", "sft_loss"} <= names


def test_dpo_learns_from_pairwise_feedback(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir, algorithm="dpo", train_batch_size=4, repeat_times=2)
    ids = _groups(run, groups=2, size=2)
    # Against the rewards (the second of each group has the higher one), people preferred the first.
    feedback_compare(run=run, experience=ids[0], other=ids[1], winner="a", author=owner)
    out = trainer_step(run_id=run.pk, step=1)
    assert out["status"] == "trained"
    assert Metric.objects.get(run=run, step=1, name="pairs").value == 2
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"consumed"}


def _sends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any]]]:
    """What the loop queues, captured instead of sent (no workers here)."""
    sent: list[tuple[str, list[Any]]] = []
    monkeypatch.setattr("apps.control.conductor._send", lambda name, args, queue, task_id: sent.append((name, args)))
    return sent


def _train_dispatch(run: Run) -> Any:
    from apps.runs.models import Dispatch

    return Dispatch.objects.get(run=run, job="train")


def test_a_chained_task_trains_every_ready_step_and_keeps_the_conductor_from_sending_them(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.control import conductor

    run = running_run(owner, tiny_model_dir, total_steps=3)
    for tag in ("a", "b", "c", "d"):
        _groups(run, tag=tag)
    sent = _sends(monkeypatch)
    # A conductor beat between the chained steps (as the loop's beat would come) finds the
    # run's train dispatch held by the chain and sends nothing.
    seen: list[tuple[str, int]] = []
    real_continue = conductor.train_step_continue

    def continue_then_beat(*, run: Run, step: int) -> Any:
        readiness = real_continue(run=run, step=step)
        conductor.run_advance(run=Run.objects.get(pk=run.pk))
        row = _train_dispatch(run)
        seen.append((row.state, row.step))
        return readiness

    monkeypatch.setattr(conductor, "train_step_continue", continue_then_beat)
    out = trainer_step(run_id=run.pk, step=1, chain_seconds=60)
    assert out["status"] == "trained" and out["steps"] == [1, 2, 3]
    assert not [args for name, args in sent if name == "workers.trainer.task.train_step"]
    assert seen == [("running", 1), ("running", 2), ("running", 3)]  # held by the chain, step by step
    run.refresh_from_db()
    assert run.train_step == 3 and run.current_version == 3
    assert Metric.objects.filter(run=run, name="loss").count() == 3
    assert _train_dispatch(run).state == "idle"  # the task ended: the loop may send again
    assert Experience.objects.filter(run=run, status="ready").count() == 8  # the fourth batch stays


def test_a_chain_stops_at_a_step_whose_batch_is_not_there(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir, mode="async", max_staleness=0)
    _groups(run, tag="a")
    _groups(run, tag="b")  # version 0: too stale for step 2, which needs version 1
    out = trainer_step(run_id=run.pk, step=1, chain_seconds=60)
    assert out["steps"] == [1]
    assert _train_dispatch(run).state == "idle"  # the loop sends step 2 when it can go


def test_a_chained_step_that_finds_no_batch_after_all_goes_back_to_the_conductor(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = running_run(owner, tiny_model_dir)
    _groups(run, tag="a")
    _groups(run, tag="b")
    real_claim = step_module.train_batch_claim
    calls = 0

    def claim_then_nothing(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real_claim(**kwargs) if calls == 1 else (None, [])  # another claimer was first

    monkeypatch.setattr("workers.trainer.step.train_batch_claim", claim_then_nothing)
    sent = _sends(monkeypatch)
    out = trainer_step(run_id=run.pk, step=1, chain_seconds=60)
    assert out["status"] == "trained" and out["steps"] == [1]
    run.refresh_from_db()
    assert run.train_step == 1
    # Handed back: the dispatch after the chain could queue step 2.
    assert ("workers.trainer.task.train_step", [run.pk, 2]) in sent


def test_a_task_that_finds_the_run_trained_elsewhere_hands_its_step_back_to_the_conductor(
    owner: Any, tiny_model_dir: Path
) -> None:
    import psycopg
    from django.db import connection

    from apps.control.conductor import TRAINER_LOCK_NAMESPACE

    run = running_run(owner, tiny_model_dir)
    _groups(run)
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"] or "localhost", port=db["PORT"] or 5432, dbname=db["NAME"], user=db["USER"] or None) as other:
        # The lock another trainer (one run by hand) would hold.
        other.execute("SELECT pg_advisory_lock(%s, %s)", [TRAINER_LOCK_NAMESPACE, run.pk])
        assert trainer_step(run_id=run.pk, step=1)["status"] == "busy"
    assert _train_dispatch(run).state == "idle"  # the conductor's next beat may send it again
    run.refresh_from_db()
    assert run.train_step == 0


def test_a_message_that_is_not_the_dispatched_one_does_nothing(owner: Any, tiny_model_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.control.conductor import dispatch_send

    run = running_run(owner, tiny_model_dir)
    _groups(run)
    _sends(monkeypatch)
    assert dispatch_send(run=run, job="train", step=1)
    sent_id = _train_dispatch(run).task_id
    # A stray copy (another id) finds the step sent to someone else.
    assert trainer_step(run_id=run.pk, step=1, task_id="a-stray-copy")["status"] == "superseded"
    assert Run.objects.get(pk=run.pk).train_step == 0
    # The dispatched message trains; a late copy of it afterwards does nothing.
    assert trainer_step(run_id=run.pk, step=1, task_id=sent_id)["status"] == "trained"
    assert trainer_step(run_id=run.pk, step=1, task_id=sent_id)["status"] == "superseded"
    assert Metric.objects.filter(run=run, name="loss").count() == 1


def test_a_trainer_whose_batch_lease_was_taken_back_does_not_record_its_step(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.buffer.services import batch_release

    run = running_run(owner, tiny_model_dir)
    ids = _groups(run)
    from workers.algorithms.learner import Learner

    learner_step = Learner.step

    def step_while_the_loop_takes_the_lease_back(self: Any, batch: Any) -> Any:
        out = learner_step(self, batch)
        # Meanwhile the loop took this trainer for dead and handed its leases back.
        batch_release(run=run, worker="trainer-under-test")
        return out

    monkeypatch.setattr(Learner, "step", step_while_the_loop_takes_the_lease_back)
    with pytest.raises(step_module.StepConflict, match="lease was lost"):
        trainer_step(run_id=run.pk, step=1, worker="trainer-under-test")
    run.refresh_from_db()
    assert run.train_step == 0 and not Metric.objects.filter(run=run, name="loss").exists()
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", "use_count")) == {("ready", 0)}


def test_a_step_whose_groups_are_all_tied_is_recorded_but_moves_no_weight(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir)
    ids = _groups(run)
    Experience.objects.filter(pk__in=ids).update(reward=0.3)  # every member alike: no advantage anywhere
    out = trainer_step(run_id=run.pk, step=1)
    assert out["status"] == "trained" and out["published"]
    assert set(Experience.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"consumed"}
    v0 = _weights(tiny_model_dir)
    v1 = _weights(Path(ModelVersion.objects.get(run=run, number=1).checkpoint))
    assert all(torch.equal(v0[k], v1[k]) for k in v0)
    assert Metric.objects.get(run=run, step=1, name="train/skipped_no_signal").value == 1.0


def test_a_step_records_how_much_of_its_batch_people_rated(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir)
    ids = _groups(run)  # 8 of the model's own experiences
    Experience.objects.filter(pk__in=ids[:2]).update(human_reward=1.0)
    Experience.objects.filter(pk__in=ids[2:3]).update(human_reward=0.25)
    assert trainer_step(run_id=run.pk, step=1)["status"] == "trained"
    got = dict(Metric.objects.filter(run=run, step=1, name__startswith="feedback/").values_list("name", "value"))
    assert got == {"feedback/human_share": 3 / 8, "feedback/human_reward_mean": 0.75, "feedback/expert": 0.0}


def test_a_cpu_train_worker_returns_freed_tensors_only_when_its_setting_asks(
    owner: Any, tiny_model_dir: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.trainer import resident

    tuned: list[int] = []

    def tune(*, threshold: int) -> bool:
        tuned.append(threshold)
        return True

    monkeypatch.setattr(resident, "cpu_allocator_tune", tune)
    plain = running_run(owner, tiny_model_dir)
    _groups(plain)
    assert trainer_step(run_id=plain.pk, step=1)["status"] == "trained" and tuned == []
    settings.RFT_TRAINER_CPU_MMAP_THRESHOLD = 1 << 20
    lean = running_run(owner, tiny_model_dir)
    _groups(lean)
    assert trainer_step(run_id=lean.pk, step=1)["status"] == "trained" and tuned == [1 << 20]
