"""Every label counts (issue #31, item 1): the queue serves what a label can still change
first, a late label still teaches the reward model and the page says so, and the waiting
count is one number everywhere."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.handout.lease import assignment_claim
from apps.runs.models import Run
from tests.factories import add_member, experience_row, found, make_run, make_user
from apps.runs.ports import run_view_of

pytestmark = pytest.mark.django_db


def _group(run: Run, name: str, *, version: int = 0, status: str = "pending",
           autos: tuple[float, ...] = (0.5, 0.5, 0.5, 0.5)) -> list[Experience]:
    """A group of completions of one prompt (one per automatic reward), written now by model `version`."""
    rows = [experience_row(run, key=f"{name}-{i}", group=name, status=status, model_version=version,
                           reward=None if status == "pending" else auto, auto_reward=auto,
                           prompt_text=f"Prompt of {name}", response_text=f"answer {name}.{i}")
            for i, auto in enumerate(autos)]
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


def _claimed(run: Run, who: User, size: int) -> list[int]:
    return [a.experience_id for a in assignment_claim(run=run, annotator=who, size=size)]


# ---------------------------------------------------------------- what the queue serves first


def test_a_fresh_groups_items_come_before_older_ones(olga: User, anna: User) -> None:
    # In arrival order (no rule: the default before issue 62), member by member.
    run = make_run(owner=olga, feedback={"mode": "blend", "overlap": 1, "selection": {"uncertainty": 0.0, "random_share": 0.0}})
    add_member(run, anna)
    first = _group(run, "first")
    second = _group(run, "second")
    fresh = _group(run, "fresh")
    assert _claimed(run, anna, 4) == [e.pk for e in fresh]
    assert _claimed(run, anna, 8) == [e.pk for e in second]  # the queue tops up from 4 to 8
    assert _claimed(run, anna, 12) == [e.pk for e in first]


def test_under_a_selection_rule_the_newest_policys_waiting_group_comes_first(olga: User, anna: User) -> None:
    run = make_run(owner=olga, feedback={"mode": "blend", "overlap": 1,
                                         "selection": {"variance": 1.0, "pairs": True}})
    add_member(run, anna)
    # The rule would pick the old group first (its automatic rewards spread most).
    stale = _group(run, "from-v1", version=1, autos=(0.0, 1.0, 0.0, 1.0))
    trainable = _group(run, "ready-v3", version=3, status="ready")
    fresh = _group(run, "from-v2", version=2)
    got = _claimed(run, anna, 12)
    # Waiting for people before already trainable; within those, the newest policy first.
    assert set(got[:4]) == {e.pk for e in fresh}
    assert set(got[4:8]) == {e.pk for e in stale}
    assert set(got[8:]) == {e.pk for e in trainable}


# ---------------------------------------------------------------- a late label still teaches


def test_a_late_label_lands_in_the_next_reward_model_training_set_and_the_page_says_so(olga: User,
                                                                                        anna: User) -> None:
    from workers.reward.trainer import reward_model_pairs

    run = make_run(owner=olga, feedback={"mode": "blend", "overlap": 1},
                   reward_model={"enabled": True, "heldout_share": 0.01})
    add_member(run, anna)
    group = _group(run, "trained-under-her")
    page = Client()
    page.force_login(anna)
    assert page.get(f"/runs/{run.pk}/annotate/").status_code == 200
    # The trainer took the group before she rated it (say its hold ran out).
    Experience.objects.filter(pk__in=[e.pk for e in group]).update(status="consumed")
    done = {}
    for e, score in ((group[0], "5"), (group[1], "1")):
        a = e.assignments.get(annotator=anna)
        r = page.post(f"/runs/{run.pk}/annotate/items/{a.pk}/rate/", {"score": score}, HTTP_HX_REQUEST="true")
        assert r.status_code == 200
        done[e.pk] = r.content.decode()
    assert all("late: teaches the reward model" in html for html in done.values())
    assert not any("not folded" in html for html in done.values())
    # Her two ratings are a preference of the next reward model's training set.
    train, _ = reward_model_pairs(run=run_view_of(run))
    assert [(p.chosen_id, p.rejected_id) for p in train] == [(group[0].pk, group[1].pk)]
    # The trained reward stayed what the trainer saw.
    assert Experience.objects.get(pk=group[0].pk).human_reward is None


def test_the_api_says_what_a_late_label_does(olga: User) -> None:
    from apps.envapi.services import api_key_create

    run = make_run(owner=olga, feedback={"mode": "blend", "overlap": 1}, reward_model={"enabled": True})
    group = _group(run, "trained")
    Experience.objects.filter(pk__in=[e.pk for e in group]).update(status="consumed")
    _, raw = api_key_create(name="env", runs=[run], actions=["read", "feedback"], created_by=olga)
    r = Client().post(f"/api/v1/runs/{run.pk}/feedback", data={"kind": "rating", "experience_id": group[0].pk,
                                                                 "score": 4},
                      content_type="application/json", headers={"Authorization": f"Bearer {raw}"})
    assert r.status_code == 200, r.content
    assert (r.json()["late"], r.json()["effect"]) == (True, "late: teaches the reward model")


# ---------------------------------------------------------------- one waiting count


def _waiting_everywhere(run: Run, person: User, raw_key: str) -> dict[str, int]:
    """The waiting count each door shows `person`: the runs list (their home page), the run
    page, the annotation page (which claims), its live counts, and the API."""
    web = Client()
    web.force_login(person)
    tag = r'waiting-tag">(\d+) waiting'
    shown = {
        "runs list": int(found(tag, web.get("/runs/").content.decode()).group(1)),
        "run page": int(found(tag, web.get(f"/runs/{run.pk}/").content.decode()).group(1)),
        "annotation page": int(found(r'id="waiting-count">(\d+)<',
                                     web.get(f"/runs/{run.pk}/annotate/").content.decode()).group(1)),
        "live counts": int(found(r'id="waiting-count">(\d+)<', web.get(f"/runs/{run.pk}/annotate/counts/",
                                                                     HTTP_HX_REQUEST="true").content.decode()).group(1)),
    }
    api = Client().get(f"/api/v1/runs/{run.pk}/annotation", headers={"Authorization": f"Bearer {raw_key}"})
    assert api.status_code == 200, api.content
    shown["api"] = api.json()["waiting"]
    return shown


def test_the_waiting_count_is_one_number_on_every_page_and_the_api(olga: User, anna: User) -> None:
    from apps.envapi.services import api_key_create

    run = make_run(owner=olga, feedback={"mode": "blend", "overlap": 1})
    add_member(run, anna)
    bob = make_user("bob")
    add_member(run, bob)
    for i in range(5):
        _group(run, f"g{i}")
    trained = _group(run, "trained", status="ready")
    Experience.objects.filter(pk__in=[e.pk for e in trained]).update(status="consumed")  # nothing waits there
    keys = {p.username: api_key_create(name=p.username, runs=[run], actions=["read"], created_by=p)[1]
            for p in (olga, anna)}
    # Bob has taken six of the twenty items; fourteen wait for Anna. Opening her annotation
    # page puts eight of them in her queue: still fourteen, wherever she looks.
    assert len(assignment_claim(run=run, annotator=bob, size=6)) == 6
    assert set(_waiting_everywhere(run, anna, keys["anna"]).values()) == {14}
    # Six are left for Olga, the owner (her page then takes them).
    assert set(_waiting_everywhere(run, olga, keys["olga"]).values()) == {6}
    # Anna rates two of her items and skips one: three fewer for her, and the skipped one
    # waits for Olga now.
    web = Client()
    web.force_login(anna)
    queue = list(anna.assignments.filter(status="leased").order_by("id"))
    for a in queue[:2]:
        assert web.post(f"/runs/{run.pk}/annotate/items/{a.pk}/rate/", {"score": "4"}).status_code == 302
    assert web.post(f"/runs/{run.pk}/annotate/items/{queue[2].pk}/skip/").status_code == 302
    assert set(_waiting_everywhere(run, anna, keys["anna"]).values()) == {5}
    assert set(_waiting_everywhere(run, olga, keys["olga"]).values()) == {7}


def test_a_page_loaded_after_the_queue_went_stale_serves_fresh_items_first(olga: User, anna: User) -> None:
    # Arrival order (no rule: the default before issue 62).
    run = make_run(owner=olga, feedback={"mode": "blend", "overlap": 1, "selection": {"uncertainty": 0.0, "random_share": 0.0}})
    add_member(run, anna)
    early = _group(run, "step-9")
    page = Client()
    page.force_login(anna)
    assert page.get(f"/runs/{run.pk}/annotate/").status_code == 200
    # She went away; her items' group trained (its hold ran out), and new rollouts came.
    Experience.objects.filter(pk__in=[e.pk for e in early]).update(status="consumed")
    fresh = _group(run, "step-27", version=3)
    html = page.get(f"/runs/{run.pk}/annotate/").content.decode()
    shown = [int(pk) for pk in re.findall(r'class="item[^"]*"[^>]*data-experience="(\d+)"', html)]
    # What her label can still change first (the fresh group), her stale items after it.
    assert shown == [e.pk for e in fresh] + [e.pk for e in early]
