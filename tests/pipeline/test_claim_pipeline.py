"""Operators applied to a claimed batch before training; filtered rows never reach the trainer."""

from __future__ import annotations

import pytest

from apps.buffer.drafts import ExperienceDraft
from apps.buffer.models import Experience
from apps.buffer.services import batch_ack, batch_claim, experience_write
from apps.feedback.kinds.flag import feedback_flag
from tests.factories import experience_row
from tests.pipeline.conftest import metrics, reasons

pytestmark = pytest.mark.django_db


def _group(run, group: str, rewards: list[float | None], **fields) -> list[ExperienceDraft]:
    return [experience_row(run, key=f"{group}-{i}", group=group, reward=r, **fields) for i, r in enumerate(rewards)]


def _fold_late_ratings(run, group: str, rewards: list[float]) -> None:
    # What the fold does when human ratings arrive: rewards set, rows ready.
    for i, reward in enumerate(rewards):
        Experience.objects.filter(run=run, key=f"{group}-{i}").update(
            human_reward=reward, reward=reward, status="ready"
        )


def test_a_group_whose_late_ratings_make_it_all_equal_is_filtered_at_claim_time(
    make_pipeline_run, django_capture_on_commit_callbacks
) -> None:
    run = make_pipeline_run(
        on_write=[{"name": "reward_variance"}], on_claim=[{"name": "reward_variance"}],
        feedback={"mode": "human"}, repeat_times=4,
    )
    experience_write(experiences=[
        *_group(run, "rated-equal", [None] * 4, status="pending"),
        *_group(run, "rated-apart", [None] * 4, status="pending"),
    ])
    assert reasons(run) == {}  # nothing to judge while the ratings are pending
    _fold_late_ratings(run, "rated-equal", [1.0, 1.0, 1.0, 1.0])
    _fold_late_ratings(run, "rated-apart", [1.0, 0.0, 0.5, 1.0])

    with django_capture_on_commit_callbacks(execute=True):
        claimed = batch_claim(run=run, worker="trainer", size=8, group_complete=True)

    assert {e.group_id for e in claimed} == {"rated-apart"}
    assert {e.status for e in claimed} == {"leased"}
    assert set(reasons(run)) == {f"rated-equal-{i}" for i in range(4)}
    assert all(r.startswith("zero_variance") for r in reasons(run).values())
    equal = Experience.objects.filter(run=run, group_id="rated-equal")
    assert {(e.status, e.lease_owner) for e in equal} == {("filtered", "")}
    assert metrics(run) == {"pipeline/claim/reward_variance/zero_variance": 4.0}


def test_filtered_rows_never_reach_the_trainer(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "blocklist", "params": {"patterns": ["forbidden"]}}],
                            on_claim=[{"name": "length_bounds", "params": {"max_tokens": 5}}])
    experience_write(experiences=[
        experience_row(run, key="bad", response_text="forbidden words", priority=9.0),
        experience_row(run, key="written-filtered", status="filtered", filter_reason="by the writer", priority=8.0),
        experience_row(run, key="long", response_len=6, priority=7.0),
        *[experience_row(run, key=f"ok{i}", priority=float(i)) for i in range(3)],
    ])
    seen: list[str] = []
    while batch := batch_claim(run=run, worker="trainer", size=2):
        seen += [e.key for e in batch]
        batch_ack(run=run, worker="trainer", ids=[e.pk for e in batch])
    assert sorted(seen) == ["ok0", "ok1", "ok2"]
    assert reasons(run) == {"bad": "blocklist: forbidden", "written-filtered": "by the writer", "long": "too_long: 6 tokens"}
    assert Experience.objects.filter(run=run, status="filtered", use_count__gt=0).count() == 0


def test_a_claim_tops_up_what_its_pipeline_removed(make_pipeline_run) -> None:
    run = make_pipeline_run(on_claim=[{"name": "blocklist", "params": {"patterns": ["junk"]}}])
    experience_write(experiences=[
        *[experience_row(run, key=f"junk{i}", response_text="junk", priority=10.0) for i in range(3)],
        *[experience_row(run, key=f"ok{i}", priority=1.0) for i in range(4)],
    ])
    claimed = batch_claim(run=run, worker="w", size=3)
    assert sorted(e.key for e in claimed) == ["ok0", "ok1", "ok2"]
    assert Experience.objects.filter(run=run, status="filtered").count() == 3


def test_human_flagged_experiences_are_filtered_at_claim(make_pipeline_run, annotator) -> None:
    run = make_pipeline_run(on_claim=[{"name": "human_flagged"}])
    experience_write(experiences=[experience_row(run, key="flagged"), experience_row(run, key="fine")])
    flagged = Experience.objects.get(run=run, key="flagged")
    feedback_flag(run=run, experience=flagged, author=annotator, reason="wrong maths")
    assert [e.key for e in batch_claim(run=run, worker="w", size=5)] == ["fine"]
    assert reasons(run) == {"flagged": "human_flagged: wrong maths"}


def test_a_kind_of_its_own_that_flags_is_filtered_at_claim_by_its_declaration(make_pipeline_run, annotator) -> None:
    """The pipeline asks the kinds which flag (`marks_flagged`), not for the name "flag": a kind a
    plugin adds that flags drops its experiences too, and the built-in flag still does."""
    from apps.feedback.kinds import FeedbackKind, kind_register, kind_unregister
    from apps.feedback.models import Feedback

    class Unsafe(FeedbackKind):  # a team's own "this leaks a secret" mark
        name = "leaks_secret"
        marks_flagged = True

    kind_register(Unsafe)
    try:
        run = make_pipeline_run(on_claim=[{"name": "human_flagged"}])
        experience_write(experiences=[experience_row(run, key=k) for k in ("leaks", "flagged", "fine")])
        leaks = Experience.objects.get(run=run, key="leaks")
        Feedback.objects.create(run=run, kind="leaks_secret", experience=leaks, group_id=leaks.group_id,
                                author=annotator, value={"reason": "prints the API key"})
        feedback_flag(run=run, experience=Experience.objects.get(run=run, key="flagged"), author=annotator,
                      reason="wrong maths")
        assert [e.key for e in batch_claim(run=run, worker="w", size=5)] == ["fine"]
        assert reasons(run) == {"leaks": "human_flagged: prints the API key", "flagged": "human_flagged: wrong maths"}
    finally:
        kind_unregister("leaks_secret")


def test_a_flag_the_owner_rejected_filters_nothing(make_pipeline_run, annotator, owner) -> None:
    from apps.feedback.review.services import feedback_reject

    run = make_pipeline_run(on_claim=[{"name": "human_flagged"}])
    experience_write(experiences=[experience_row(run, key="flagged"), experience_row(run, key="fine")])
    flag = feedback_flag(run=run, experience=Experience.objects.get(run=run, key="flagged"), author=annotator,
                         reason="I misread it")
    assert "no longer counted by the data pipeline" in feedback_reject(run=run, feedback_id=flag.pk, reviewer=owner).effect
    assert sorted(e.key for e in batch_claim(run=run, worker="w", size=5)) == ["fine", "flagged"]
    assert reasons(run) == {}


def test_claim_time_cleaning_is_saved_on_the_rows_it_returns(make_pipeline_run) -> None:
    run = make_pipeline_run(on_claim=[{"name": "clean"}])
    experience_write(experiences=[experience_row(run, key="k", response_text="two  \n\n\n\nlines\x1b", finish_reason="length")])
    [claimed] = batch_claim(run=run, worker="w", size=1)
    stored = Experience.objects.get(pk=claimed.pk)
    assert claimed.response_text == stored.response_text == "two\n\nlines"
    assert stored.action_mask == [0, 0, 0, 0] and stored.status == "leased"
