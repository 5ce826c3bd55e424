"""How long a group waits for people (issue 62 item 2): under `learned`, until the reward model
passes its gate, a group nobody holds waits `hold_seconds`, a held one while its hold lasts,
never past `wait_seconds`; `blend` (and `human`) wait the whole `wait_seconds`, as does
`learned` once its reward model scores or where nothing can be held. Every moment is an
explicit `now=`: nothing sleeps."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db.models import Min

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.handout.expiry import feedback_wait_expire, wait_window
from apps.feedback.handout.lease import assignment_claim
from apps.feedback.kinds.rating import feedback_rate
from apps.feedback.reward_model.versions import reward_model_usable
from apps.rewards.models import RewardModel
from apps.runs.models import Run
from kernel.fold import reward_combine
from tests.factories import add_member, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db

HOLD, CAP, WAIT = 30.0, 120.0, 600.0


def _run(mode: str, **feedback: Any) -> Run:
    return make_run(owner=make_user(f"olga-{mode}"), train_batch_size=8, repeat_times=4, reward_model={"enabled": True},
                    feedback={"mode": mode, "overlap": 1, "fallback": "auto", "wait_seconds": WAIT,
                              "hold_seconds": HOLD, "hold_cap_seconds": CAP, "min_rm_accuracy": 0.8,
                              "rm_gate": "bound", **feedback})


def _group(run: Run, name: str, *, age: float = 0.0) -> tuple[list[int], datetime]:
    """A pending group of 4 written `age` seconds ago; its ids and when it was written."""
    rows = [experience_row(run, key=f"{name}-{i}", group=name, status="pending", reward=None, auto_reward=0.25 * i,
                           response_text=f"answer {name}.{i}") for i in range(4)]
    ids = sorted(experience_write(experiences=rows).ids)
    members = Experience.objects.filter(pk__in=ids)
    if age:
        members.update(created_at=members.aggregate(t=Min("created_at"))["t"] - timedelta(seconds=age))
    since = members.aggregate(t=Min("created_at"))["t"]
    assert since is not None
    return ids, since


def _statuses(ids: list[int]) -> set[str]:
    return set(Experience.objects.filter(pk__in=ids).values_list("status", flat=True))


def _after(since: datetime, seconds: float) -> datetime:
    return since + timedelta(seconds=seconds)


def test_under_learned_a_group_nobody_holds_waits_hold_seconds_not_wait_seconds() -> None:
    run = _run("learned")
    assert reward_model_usable(run=run) is None
    ids, since = _group(run, "g")
    anna = make_user("anna")
    add_member(run, anna)
    feedback_rate(run=run, author=anna, experience=ids[0], score=5)  # a label before the window ends
    assert feedback_wait_expire(now=_after(since, HOLD - 1)).groups_ready == 0
    assert feedback_wait_expire(now=_after(since, HOLD + 1)).groups_ready == 1
    # The fallback as at the end of any window: the rated member keeps its fold, the rest
    # stand on its scale (apps.feedback.handout.expiry._fallback_human).
    rated, *unrated = Experience.objects.filter(pk__in=ids).order_by("id")
    assert _statuses(ids) == {"ready"}
    assert rated.human_reward == 1.0
    for m in unrated:
        assert m.reward == pytest.approx(reward_combine(feedback_cfg=run.cfg.feedback, auto=m.auto_reward, human=1.0))


def test_under_learned_a_held_group_waits_while_the_hold_lasts() -> None:
    run = _run("learned")
    # Written 100 s ago (past hold_seconds): Anna opens the page now, and it is hers to rate.
    ids, since = _group(run, "g", age=100)
    anna = make_user("anna")
    add_member(run, anna)
    assert {a.experience_id for a in assignment_claim(run=run, annotator=anna, size=2)} <= set(ids)
    held = Experience.objects.filter(pk__in=ids).aggregate(t=Min("held_until"))["t"]
    assert held is not None and held > _after(since, HOLD)
    assert feedback_wait_expire(now=held - timedelta(seconds=1)).groups_ready == 0
    assert _statuses(ids) == {"pending"}
    # The hold ends (no sign of work for hold_seconds): so does the window.
    assert feedback_wait_expire(now=held + timedelta(seconds=1)).groups_ready == 1
    assert _statuses(ids) == {"ready"}


def test_under_learned_a_held_group_waits_no_longer_than_wait_seconds() -> None:
    run = _run("learned", wait_seconds=110.0)
    ids, since = _group(run, "g", age=100)
    anna = make_user("anna")
    add_member(run, anna)
    assignment_claim(run=run, annotator=anna, size=2)
    held = Experience.objects.filter(pk__in=ids).aggregate(t=Min("held_until"))["t"]
    assert held is not None and held > _after(since, 111)
    assert feedback_wait_expire(now=_after(since, 109)).groups_ready == 0
    assert feedback_wait_expire(now=_after(since, 111)).groups_ready == 1


@pytest.mark.parametrize("mode", ["blend", "human"])
def test_blend_and_human_wait_the_whole_window(mode: str) -> None:
    run = _run(mode)
    ids, since = _group(run, "g")
    assert wait_window(run=run).unheld == WAIT
    assert feedback_wait_expire(now=_after(since, HOLD + 1)).groups_ready == 0
    assert feedback_wait_expire(now=_after(since, WAIT - 1)).groups_ready == 0
    assert feedback_wait_expire(now=_after(since, WAIT + 1)).groups_ready == 1
    assert _statuses(ids) == {"ready"}


def test_once_the_reward_model_passes_its_gate_learned_waits_as_before() -> None:
    run = _run("learned")
    RewardModel.objects.create(run=run, version=1, path="/x", base="b", accuracy=0.95, pairs_heldout=200)
    assert reward_model_usable(run=run) is not None
    ids, since = _group(run, "g")  # not scored yet: it waits for the score, or the whole window
    assert feedback_wait_expire(now=_after(since, HOLD + 1)).groups_ready == 0
    assert feedback_wait_expire(now=_after(since, WAIT + 1)).groups_ready == 1


def test_under_learned_without_holds_a_group_waits_the_whole_window() -> None:
    run = _run("learned", hold_seconds=0.0)
    ids, since = _group(run, "g")
    assert feedback_wait_expire(now=_after(since, WAIT - 1)).groups_ready == 0
    assert feedback_wait_expire(now=_after(since, WAIT + 1)).groups_ready == 1


def test_the_run_page_says_when_a_group_stops_waiting_under_learned() -> None:
    from django.utils import timezone

    from apps.control.selectors import run_waiting

    run = _run("learned")
    _, since = _group(run, "g")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    people = {w["what"]: w for w in run_waiting(run=Run.objects.get(pk=run.pk))}["people"]["text"]
    assert people.startswith("1 group wait for people's feedback; the oldest then trains on the automatic reward at "
                             f"{timezone.localtime(_after(since, HOLD)):%H:%M:%S}")
    assert people.endswith("(learned, until the reward model passes its gate: 30 s unless a person holds it, "
                           "600 s at most)")
    blend = _run("blend")
    _, since = _group(blend, "g")
    Run.objects.filter(pk=blend.pk).update(status=Run.Status.RUNNING)
    people = {w["what"]: w for w in run_waiting(run=Run.objects.get(pk=blend.pk))}["people"]["text"]
    assert f"at {timezone.localtime(_after(since, WAIT)):%H:%M:%S} (600 s wait)" in people
