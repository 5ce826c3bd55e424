"""Claims, acks, releases, leases and replay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.buffer.models import Experience, TaskAttempt
from apps.buffer.services import (
    batch_ack,
    batch_claim,
    batch_release,
    experience_write,
    lease_reap,
    task_claim,
    task_finish,
    task_release,
)
from apps.runs.models import Run
from tests.factories import experience_row, make_experiences, make_run, make_taskset

pytestmark = pytest.mark.django_db


def test_it_claims_in_priority_order_and_leases_to_the_worker(run: Run) -> None:
    experience_write(experiences=[experience_row(run, key=f"k{i}", priority=float(i)) for i in range(6)])
    claimed = batch_claim(run=run, worker="w1", size=3)
    assert [e.key for e in claimed] == ["k5", "k4", "k3"]
    assert all(e.status == Experience.Status.LEASED and e.lease_owner == "w1" for e in claimed)
    assert all(e.lease_expires_at is not None and e.lease_expires_at > timezone.now() for e in claimed)
    assert [e.key for e in batch_claim(run=run, worker="w2", size=10)] == ["k2", "k1", "k0"]
    assert batch_claim(run=run, worker="w3", size=10) == []


def test_claimed_experiences_carry_every_field_as_the_orm_reads_it(run: Run) -> None:
    experience_write(experiences=[experience_row(
        run, key="rich", messages=[{"role": "user", "content": "2+2?"}], reward_parts={"math_accuracy": 1.0},
        metadata={"content_hash": "abc", "nested": {"x": [1, 2]}}, action_mask=[1, 0, 1], logprobs=[-0.1, -0.2, -0.3],
        token_ids=[5, 6, 7, 8, 9], prompt_length=2,
    )])
    [claimed] = batch_claim(run=run, worker="w1", size=1)
    stored = Experience.objects.get(pk=claimed.pk)
    for field in Experience._meta.concrete_fields:
        assert getattr(claimed, field.attname) == getattr(stored, field.attname), field.name
    assert claimed.metadata["nested"] == {"x": [1, 2]}
    assert claimed.response_length == 3
    claimed.priority = 9.0
    claimed.save(update_fields=["priority"])  # a claimed row is a normal model instance
    assert Experience.objects.get(pk=claimed.pk).priority == 9.0


def test_it_claims_only_from_its_own_run(run: Run, owner) -> None:
    other = make_run(owner=owner, name="other")
    make_experiences(other, groups=1)
    assert batch_claim(run=run, worker="w", size=10) == []


def test_pending_and_filtered_experiences_are_not_claimed(run: Run) -> None:
    experience_write(
        experiences=[
            experience_row(run, key="pending", status="pending"),
            experience_row(run, key="filtered", status="filtered"),
            experience_row(run, key="ready"),
        ]
    )
    assert [e.key for e in batch_claim(run=run, worker="w", size=10)] == ["ready"]


def test_acked_experiences_are_consumed_exactly_once(run: Run) -> None:
    make_experiences(run, groups=2, group_size=4)
    claimed = batch_claim(run=run, worker="w", size=8)
    assert batch_ack(run=run, worker="w", ids=[e.pk for e in claimed]) == 8
    assert set(Experience.objects.filter(run=run).values_list("status", "use_count")) == {("consumed", 1)}
    assert batch_claim(run=run, worker="w", size=8) == []


def test_a_worker_cannot_ack_rows_leased_to_another(run: Run) -> None:
    make_experiences(run, groups=1)
    claimed = batch_claim(run=run, worker="w1", size=4)
    assert batch_ack(run=run, worker="w2", ids=[e.pk for e in claimed]) == 0
    assert Experience.objects.filter(status="leased").count() == 4


def test_released_rows_come_back_untouched(run: Run) -> None:
    make_experiences(run, groups=1)
    claimed = batch_claim(run=run, worker="w", size=4)
    assert batch_release(run=run, worker="w", ids=[claimed[0].pk]) == 1
    again = batch_claim(run=run, worker="w2", size=4)
    assert [e.pk for e in again] == [claimed[0].pk]
    assert again[0].use_count == 0


def test_it_releases_expired_leases(run: Run) -> None:
    make_experiences(run, groups=1)
    batch_claim(run=run, worker="dead", size=4, lease_seconds=60)
    assert lease_reap().experiences == 0
    result = lease_reap(now=timezone.now() + timedelta(seconds=61))
    assert result.experiences == 4
    assert Experience.objects.filter(status="ready", lease_owner="").count() == 4


def test_nothing_older_than_the_staleness_bound_is_claimed(run: Run) -> None:
    for version in range(5):
        make_experiences(run, groups=1, group_size=2, model_version=version)
    claimed = batch_claim(run=run, worker="w", size=100, min_version=3)
    assert {e.model_version for e in claimed} == {3, 4}
    assert len(claimed) == 4


def test_whole_groups_only_when_asked(run: Run) -> None:
    complete = make_experiences(run, groups=1, group_size=4)
    experience_write(
        experiences=[
            experience_row(run, key="open-0", group="open"),
            experience_row(run, key="open-1", group="open", status="pending"),
        ]
    )
    claimed = batch_claim(run=run, worker="w", size=100, group_complete=True)
    assert sorted(e.pk for e in claimed) == sorted(e.pk for e in complete)
    # Without the flag the ready member of the unfinished group is claimable.
    assert [e.key for e in batch_claim(run=run, worker="w", size=100)] == ["open-0"]


def test_group_claims_never_split_a_group_to_fit_the_size(run: Run) -> None:
    make_experiences(run, groups=3, group_size=4)
    first = batch_claim(run=run, worker="w", size=6, group_complete=True)
    assert len(first) == 4 and len({e.group_id for e in first}) == 1
    # The first group is taken whole even when it alone is larger than the size.
    second = batch_claim(run=run, worker="w", size=2, group_complete=True)
    assert len(second) == 4


def test_equal_priority_groups_are_claimed_in_the_order_they_were_written(run: Run) -> None:
    # Group names whose text order is the reverse of their writing order ("g10" < "g9"): the
    # claim must follow the writing (first member's id), which a rerun of a seed repeats.
    for name in ("g9", "g10", "g100"):
        experience_write(experiences=[experience_row(run, key=f"{name}-{i}", group=name) for i in range(2)])
    order = [batch_claim(run=run, worker="w", size=2, group_complete=True)[0].group_id for _ in range(3)]
    assert order == ["g9", "g10", "g100"]


def test_a_group_with_a_leased_member_waits(run: Run) -> None:
    (exp, *_rest) = make_experiences(run, groups=1, group_size=3)
    batch_claim(run=run, worker="w", size=1)
    assert batch_claim(run=run, worker="w2", size=10, group_complete=True) == []


def test_replay_returns_rows_until_max_uses_with_decayed_priority(owner) -> None:
    run = make_run(owner=owner, replay={"max_uses": 3, "priority_decay": 0.5})
    experience_write(experiences=[experience_row(run, key="x", priority=8.0)])
    for expected_priority in (8.0, 4.0, 2.0):
        (claimed,) = batch_claim(run=run, worker="w", size=1)
        assert claimed.priority == expected_priority
        batch_ack(run=run, worker="w", ids=[claimed.pk])
    row = Experience.objects.get(key="x")
    assert (row.status, row.use_count) == ("consumed", 3)


def test_replay_cooldown_holds_a_row_back(owner) -> None:
    run = make_run(owner=owner, replay={"max_uses": 2, "cooldown_seconds": 3600})
    experience_write(experiences=[experience_row(run, key="x")])
    (claimed,) = batch_claim(run=run, worker="w", size=1)
    batch_ack(run=run, worker="w", ids=[claimed.pk])
    assert batch_claim(run=run, worker="w", size=1) == []
    Experience.objects.filter(key="x").update(last_used_at=timezone.now() - timedelta(hours=2))
    assert len(batch_claim(run=run, worker="w", size=1)) == 1


def test_expert_claims_can_be_separated(run: Run) -> None:
    experience_write(experiences=[experience_row(run, key="own"), experience_row(run, key="expert", is_expert=True)])
    assert [e.key for e in batch_claim(run=run, worker="w", size=5, expert=True)] == ["expert"]
    assert [e.key for e in batch_claim(run=run, worker="w", size=5, expert=False)] == ["own"]


def test_task_claims_lease_each_attempt_once_and_move_through_epochs(owner) -> None:
    run = make_run(owner=owner, taskset=make_taskset(3, owner=owner), epochs=2)
    first = task_claim(run=run, worker="e1", size=2)
    second = task_claim(run=run, worker="e2", size=5)
    assert len(first) == 2 and len(second) == 1
    assert {a.task_id for a in first}.isdisjoint({a.task_id for a in second})
    # Epoch 1 waits until epoch 0's leased attempts are done.
    assert task_claim(run=run, worker="e3", size=5) == []
    task_finish(run=run, worker="e1", ids=[a.pk for a in first], model_version=0)
    task_finish(run=run, worker="e2", ids=[a.pk for a in second], model_version=0)
    epoch1 = task_claim(run=run, worker="e3", size=5)
    assert {a.epoch for a in epoch1} == {1} and len(epoch1) == 3
    task_finish(run=run, worker="e3", ids=[a.pk for a in epoch1], model_version=1)
    assert task_claim(run=run, worker="e3", size=5) == []


def _epoch_orders(run: Run, *, epochs: int, size: int) -> list[list[int]]:
    orders = []
    for _ in range(epochs):
        claimed = task_claim(run=run, worker="e", size=size)
        orders.append([a.task.index for a in claimed])
        task_finish(run=run, worker="e", ids=[a.pk for a in claimed], model_version=0)
    return orders


def test_each_epoch_hands_the_taskset_out_in_its_own_seeded_order(owner) -> None:
    taskset = make_taskset(12, owner=owner)
    orders = _epoch_orders(make_run(owner=owner, taskset=taskset, epochs=3, seed=7), epochs=3, size=12)
    assert all(sorted(o) == list(range(12)) for o in orders)  # every task once per epoch
    assert len({tuple(o) for o in orders}) == 3 and orders[0] != list(range(12))
    # The same seed gives the same orders; another seed others.
    assert _epoch_orders(make_run(owner=owner, taskset=taskset, epochs=3, seed=7), epochs=3, size=12) == orders
    assert _epoch_orders(make_run(owner=owner, taskset=taskset, epochs=3, seed=8), epochs=3, size=12) != orders
    # shuffle off: the taskset's own order, every epoch.
    plain = make_run(owner=owner, taskset=taskset, epochs=2, shuffle=False)
    assert _epoch_orders(plain, epochs=2, size=12) == [list(range(12))] * 2


def test_released_and_expired_task_attempts_go_back_to_the_queue(owner) -> None:
    run = make_run(owner=owner, taskset=make_taskset(2, owner=owner))
    claimed = task_claim(run=run, worker="e1", size=2, lease_seconds=30)
    assert task_release(run=run, worker="e1", ids=[claimed[0].pk]) == 1
    assert lease_reap(now=timezone.now() + timedelta(seconds=31)).task_attempts == 1
    assert TaskAttempt.objects.filter(run=run, status="queued").count() == 2
    again = task_claim(run=run, worker="e2", size=5)
    assert len(again) == 2 and max(a.tries for a in again) == 2
