"""The trainer's durable state: every step journals its batch before it commits, a full
snapshot comes every RFT_TRAINER_SNAPSHOT_STEPS steps, and a restarted trainer replays the
journal from the newest snapshot to exactly the state it had (real Postgres, this process)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Feedback
from apps.feedback.kinds.pairwise import feedback_compare
from apps.runs.models import Metric, ModelVersion, Run
from apps.feedback.selectors import preferences_among
from tests.factories import experience_row
from tests.trainer.conftest import running_run
from workers.trainer import resident as trainer_resident
from workers.trainer.journal import journal_path, journal_read, state_dir, trainer_dir
from workers.trainer.step import trainer_step
from apps.runs.ports import run_view_of

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SNAPSHOT_STEPS = 3


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> Iterator[Path]:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    settings.RFT_TRAINER_SNAPSHOT_STEPS = SNAPSHOT_STEPS
    trainer_resident.RESIDENTS.clear()
    yield settings.RFT_STORAGE_DIR
    trainer_resident.RESIDENTS.clear()


def _groups(run: Run, *, tag: str, groups: int = 2, size: int = 4) -> list[int]:
    rows = [
        experience_row(run, key=f"{tag}g{g}-{i}", group=f"{tag}g{g}", prompt_len=3 + g, response_len=2 + i,
                       reward=float(i % 2))
        for g in range(groups) for i in range(size)
    ]
    return experience_write(experiences=rows).ids


def _state(run: Run) -> dict[str, Any]:
    """A copy of the resident trainer state of `run`: weights, optimizer and scheduler."""
    res = trainer_resident.RESIDENTS[run.pk]
    return {
        "weights": {k: v.detach().clone() for k, v in res.model.state_dict().items()},
        "optimizer": copy.deepcopy(res.learner.optimizer_state()),
    }


def _restarted(run: Run) -> dict[str, Any]:
    """The state a freshly started worker rebuilds for `run` (the resident is forgotten)."""
    trainer_resident.RESIDENTS.clear()
    run.refresh_from_db()
    trainer_resident.resident_for(run_view_of(run))
    return _state(run)


def _assert_identical(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _on_disk(run: Run) -> tuple[set[int], set[int]]:
    """(snapshot steps, journaled steps) in the run's trainer storage."""
    root = trainer_dir(run.pk)
    snapshots = {int(p.name.split("-")[1]) for p in root.glob("step-*")}
    journal = {int(p.stem.split("-")[1]) for p in (root / "journal").glob("step-*.json")}
    return snapshots, journal


@pytest.mark.parametrize("snapshot_steps", [SNAPSHOT_STEPS, 100])
def test_a_trainer_restarted_between_snapshots_replays_the_journal_to_the_same_weights_and_optimizer_state(
    owner: Any, tiny_model_dir: Path, settings: Any, snapshot_steps: int
) -> None:
    settings.RFT_TRAINER_SNAPSHOT_STEPS = snapshot_steps
    run = running_run(owner, tiny_model_dir)
    # A spare batch: a train-mode run that uses up its buffer finishes, and its trainer then
    # drops the resident state these tests compare against.
    for step in range(1, 7):
        _groups(run, tag=f"s{step}")
    for step in range(1, 6):
        assert trainer_step(run_id=run.pk, step=step)["status"] == "trained"
    before = _state(run)
    snapshots, journal = _on_disk(run)
    if snapshot_steps == SNAPSHOT_STEPS:
        # Step 5 has no snapshot of its own: restart means snapshot 3 plus steps 4 and 5.
        assert (snapshots, journal) == ({3}, {4, 5})
    else:
        assert (snapshots, journal) == (set(), {1, 2, 3, 4, 5})

    after = _restarted(run)

    _assert_identical(after["weights"], before["weights"], "weights")
    _assert_identical(after["optimizer"], before["optimizer"], "optimizer")
    # Adam moments are there to compare: the replay did not just rebuild a fresh optimizer.
    assert before["optimizer"]["optimizer"]["state"]


def test_a_crash_between_the_journal_write_and_the_commit_does_not_train_the_step_twice(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = running_run(owner, tiny_model_dir)
    first = _groups(run, tag="a")
    second = _groups(run, tag="b")
    _groups(run, tag="spare")  # the run goes on after step 2 (see above)
    assert trainer_step(run_id=run.pk, step=1)["status"] == "trained"
    after_one = _state(run)

    def crash(**kwargs: Any) -> None:
        raise RuntimeError("worker killed before the commit")

    # batch_commit_step (the step record and the batch's ack) runs inside the step's
    # transaction, after the journal entry is on disk.
    monkeypatch.setattr("apps.buffer.ports.batch_commit_step", crash)
    with pytest.raises(RuntimeError, match="killed"):
        trainer_step(run_id=run.pk, step=2)
    monkeypatch.undo()
    run.refresh_from_db()
    assert run.train_step == 1 and journal_path(run.pk, 2).exists()

    # A restart ignores the journal entry of the step the database never recorded...
    _assert_identical(_restarted(run), after_one)
    # ...and the step's next attempt trains it once and replaces the entry.
    assert trainer_step(run_id=run.pk, step=2)["status"] == "trained"
    after_two = _state(run)
    assert set(Experience.objects.filter(pk__in=first + second).values_list("status", "use_count")) == {("consumed", 1)}
    batch, _ = journal_read(journal_path(run.pk, 2))
    assert sorted(batch.ids) == sorted(second)
    _assert_identical(_restarted(run), after_two)


def test_pruning_keeps_exactly_what_a_restart_needs(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir, total_steps=8)
    for step in range(1, 9):
        _groups(run, tag=f"s{step}")
    for step in range(1, 9):
        assert trainer_step(run_id=run.pk, step=step)["status"] == "trained"
        # Snapshots every 3 steps and at the last one; the newest replaces the older ones
        # and the journal up to it.
        newest = max((s for s in (3, 6, 8) if s <= step), default=0)
        assert _on_disk(run) == ({newest} - {0}, set(range(newest + 1, step + 1))), step
        # What is left is enough: a restart after any step rebuilds that step's state.
        if step < 8:
            live = _state(run)
            _assert_identical(_restarted(run), live, f"step {step}")
    # After the last step the trainer frees the run's state; its snapshot is all there is.
    assert run.pk not in trainer_resident.RESIDENTS
    assert (state_dir(run.pk, 8) / "config.json").exists()


def test_a_replay_trains_on_the_batch_as_it_was_even_after_its_feedback_changed(
    owner: Any, tiny_model_dir: Path
) -> None:
    run = running_run(owner, tiny_model_dir, algorithm="dpo", train_batch_size=4, repeat_times=2)
    ids = _groups(run, tag="d", groups=2, size=2)
    _groups(run, tag="spare", groups=2, size=2)  # the run goes on after step 1
    feedback_compare(run=run, experience=ids[0], other=ids[1], winner="a", author=owner)
    assert trainer_step(run_id=run.pk, step=1)["status"] == "trained"
    before = _state(run)
    # People change their minds after the step: the step still trained on the first answer.
    Feedback.objects.filter(run=run).update(value={"winner": "b"})
    Experience.objects.filter(pk__in=ids).update(reward=0.0)
    journaled, _ = journal_read(journal_path(run.pk, 1))
    assert journaled.preferences == [(ids[0], ids[1])]
    assert preferences_among(run=run, ids=ids) == [(ids[1], ids[0])]

    _assert_identical(_restarted(run), before)


def test_a_step_whose_journal_is_lost_resumes_from_the_newest_version_and_snapshots_there(
    owner: Any, tiny_model_dir: Path
) -> None:
    run = running_run(owner, tiny_model_dir, sync_interval=2)
    for step in (1, 2, 3, 4):  # one spare: the run goes on after step 3
        _groups(run, tag=f"s{step}")
    for step in (1, 2):
        assert trainer_step(run_id=run.pk, step=step)["status"] == "trained"
    journal_path(run.pk, 1).unlink()  # storage lost, not a crash of ours

    state = _restarted(run)

    # Version 1 (step 2) was published: the weights go on from there, with a fresh optimizer,
    # and that base is snapshotted so that the steps journaled from now on can be replayed.
    from safetensors.torch import load_file

    published = load_file(str(Path(ModelVersion.objects.get(run=run, number=1).checkpoint) / "model.safetensors"))
    for name, tensor in published.items():
        assert torch.equal(state["weights"][name], tensor), name
    assert not state["optimizer"]["optimizer"]["state"]
    assert (state_dir(run.pk, 2) / "optimizer.pt").exists()
    assert trainer_step(run_id=run.pk, step=3)["status"] == "trained"
    after_three = _state(run)
    _assert_identical(_restarted(run), after_three)


def test_a_worker_killed_between_the_commit_and_the_publish_keeps_the_steps_metrics_and_publishes_when_redispatched(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = running_run(owner, tiny_model_dir, sync_interval=1)
    _groups(run, tag="a")
    _groups(run, tag="b")

    def killed(**kwargs: Any) -> None:
        raise RuntimeError("worker killed after the commit")

    monkeypatch.setattr("workers.trainer.step.publish_due", killed)
    with pytest.raises(RuntimeError, match="killed"):
        trainer_step(run_id=run.pk, step=1)
    monkeypatch.undo()
    run.refresh_from_db()
    assert (run.train_step, run.current_version) == (1, 0)
    assert {"loss", "claimed", "staleness"} <= set(Metric.objects.filter(run=run, step=1).values_list("name", flat=True))

    trainer_resident.RESIDENTS.clear()
    assert trainer_step(run_id=run.pk, step=1)["status"] == "published"
    run.refresh_from_db()
    assert run.current_version == 1
    assert Metric.objects.filter(run=run, step=1, name="sync_seconds").count() == 1
    assert Metric.objects.filter(run=run, step=1, name="loss").count() == 1
