"""Issue 64 item 1: one count of label states, one order, moved by events.

The counts per run and per person (`run_ledger`, `ledger_counts`) are the states derived here
from the rows (tests/figures/test_ledger.py's rows_ledger); every place lists the states in
STATE_LINE's order, summing to the total; the API says the same; what moves a label's state
without a label being saved (a train step, a reward-model version, a review, dropped groups)
tells the run's pages (`labels.changed`) once it commits; an ended run has nobody's queue
holding anything ("In queue 18" after the run finished). The browser test beside this one
(test_states_agree_browser.py) shows the pages agreeing live."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.feedback import ledger
from apps.feedback.bulk import experiences_bulk
from apps.feedback.ledger import STATE_LINE, LedgerCounts, ledger_counts, run_ledger
from apps.feedback.models import Assignment, Feedback
from apps.feedback.review.services import feedback_reject
from apps.feedback.handout.queue import labelling_progress
from apps.feedback.handout.lease import assignment_claim
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.factories import make_experiences
from tests.figures.test_ledger import _api, _train, labelled, rm_publish, rows_ledger  # noqa: F401

pytestmark = pytest.mark.django_db

FOUR = ("trained", "reward_model", "pending", "unused")


def _from_rows(run: Run, who: User | None = None) -> Counter[str]:
    derived = rows_ledger(run)
    mine = None if who is None else set(Feedback.objects.filter(run=run, author=who).values_list("pk", flat=True))
    return Counter(s for pk, (s, _) in derived.items() if mine is None or pk in mine)


def _shown(c: LedgerCounts) -> dict[str, int]:
    return {state: n for state, _, n in c.states()}


def test_the_one_count_per_run_and_per_person_is_the_rows(labelled: dict[str, Any], owner: User,
                                                          annotator: User) -> None:
    run, bob = labelled["run"], labelled["bob"]
    everyone = _from_rows(run)
    assert _shown(ledger_counts(run=run)) == {s: everyone[s] for s in FOUR}
    for person in (annotator, bob):
        theirs = _from_rows(run, person)
        counted = ledger_counts(run=run, person=person)
        assert _shown(counted) == {s: theirs[s] for s in FOUR}, person.username
        assert counted.total == sum(theirs.values()) == Feedback.objects.filter(
            run=run, author=person, kind__in=["rating", "ranking", "pairwise", "edit"]).count()
        # The one person's count is the run ledger's row for them.
        assert counted.as_dict() == run_ledger(run=run).people[person.username].as_dict()
    # Somebody who gave nothing: zeros, every state listed.
    assert _shown(ledger_counts(run=run, person=owner)) == dict.fromkeys(FOUR, 0)
    # One order and words, summing to the total: the line the CLI and the notification write.
    c = ledger_counts(run=run)
    assert [s for s, _, _ in c.states()] == [s for s, _ in STATE_LINE] == list(FOUR)
    assert sum(n for _, _, n in c.states()) == c.total
    assert c.line() == (f"{everyone['trained']} trained, {everyone['reward_model']} taught the reward model only, "
                        f"{everyone['pending']} pending, {everyone['unused']} unused")
    # The API lists them in that order, with the words the pages use.
    body = _api(run, owner).get(f"/api/v1/runs/{run.pk}/labels").json()
    assert body["run"]["states"] == [{"state": s, "words": w, "count": everyone[s]} for s, w in STATE_LINE]
    assert body["people"]["bob"]["states"][0] == {"state": "trained", "words": "trained",
                                                  "count": _from_rows(run, bob)["trained"]}


def test_the_annotation_header_and_the_run_page_list_every_state_in_order(labelled: dict[str, Any], owner: User,
                                                                         annotator: User) -> None:
    """The header's line (old code: "yours N trained · N pending · N unused", without "taught
    the reward model"), its box, and the run page's table and line, from the rows."""
    import re

    run = labelled["run"]
    client = Client()
    client.force_login(annotator)
    html = client.get(f"/runs/{run.pk}/annotate/").content.decode()
    line = re.search(r'<span id="ledger-mine-line".*?</summary>', html, re.S)
    assert line
    mine = _from_rows(run, annotator)
    assert re.findall(r'data-state="(\w+)"><span data-ledger="\w+">(\d+)</span>', line.group(0)) == [
        (s, str(mine[s])) for s in FOUR]
    assert re.search(rf'data-ledger="total">{sum(mine.values())}<', line.group(0))
    # The box alone, as the page asks for it again live.
    box = client.get(f"/runs/{run.pk}/annotate/labels/", HTTP_HX_REQUEST="true").content.decode()
    assert line.group(0) in box and 'id="ledger-refresh"' in box
    # The run page's table: the columns in the same order.
    owner_client = Client()
    owner_client.force_login(owner)
    panel = owner_client.get(f"/runs/{run.pk}/labels/", HTTP_HX_REQUEST="true").content.decode()
    assert re.findall(r'<th class="num" data-state="(\w+)">', panel) == list(FOUR)
    everyone = _from_rows(run)
    assert re.findall(r'data-state="(\w+)"><span data-ledger="\w+">(\d+)</span>', panel) == [
        (s, str(everyone[s])) for s in FOUR]


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str, Mapping[str, object]]]:
    sent: list[tuple[int, str, Mapping[str, object]]] = []
    monkeypatch.setattr("apps.runs.events.event_publish",
                        lambda *, run_id, type, payload: sent.append((run_id, type, payload)))
    return sent


def test_what_moves_a_label_without_a_label_tells_the_pages_once_committed(
        labelled: dict[str, Any], owner: User, published: list[tuple[int, str, Mapping[str, object]]],
        django_capture_on_commit_callbacks: Any) -> None:
    run = labelled["run"]

    def told(action: Any) -> list[str]:
        published.clear()
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            action()
        assert not [t for _, t, _ in published if t == "labels.changed"], "told before the commit"
        for callback in callbacks:
            callback()
        return [str(p["why"]) for r, t, p in published if t == "labels.changed" and r == run.pk]

    # A new group, the only one ready: the trainer takes it in step 2.
    Experience.objects.filter(run=run, status="ready").update(status="pending")
    group = make_experiences(run, groups=1, group_size=2, status="pending")
    assert told(lambda: _train(run, 2, group)) == ["trained"]
    assert told(lambda: rm_publish(run)) == ["reward_model"]
    pending = next(pk for pk, (s, _) in rows_ledger(run).items() if s == "pending")
    assert told(lambda: feedback_reject(run=run, feedback_id=pending, reviewer=owner)) == ["reviewed"]
    other = make_experiences(run, groups=1, group_size=2, status="pending")
    assert told(lambda: experiences_bulk(run=run, user=owner, action="exclude", ids=[e.pk for e in other])) == [
        "filtered"]


def test_an_ended_run_has_nothing_in_anyones_queue(labelled: dict[str, Any], owner: User, annotator: User) -> None:
    run = labelled["run"]
    make_experiences(run, groups=2, group_size=2, status="pending")
    assignment_claim(run=run, annotator=annotator, size=4)
    leased = Assignment.objects.filter(run=run, annotator=annotator, status="leased").count()
    assert leased > 0
    person = {p["username"]: p for p in labelling_progress(run=run)["people"]}
    assert person["annotator"]["leased"] == leased
    run_transition(run=run, action="stop", actor=owner)
    progress = labelling_progress(run=Run.objects.get(pk=run.pk))
    assert {p["username"]: p["leased"] for p in progress["people"]} == dict.fromkeys(
        (p["username"] for p in progress["people"]), 0)
    assert progress["leased"] == progress["remaining"] == 0


@pytest.fixture
def one_more_state() -> Iterator[None]:
    before = list(STATE_LINE)
    ledger.ledger_state_add(state="evaluation_vote", words="evaluation votes: not trained")
    yield
    STATE_LINE[:] = before


def test_a_state_added_to_the_line_shows_everywhere_the_line_is_read(labelled: dict[str, Any],
                                                                     one_more_state: None) -> None:
    """What another module (a blind evaluation's votes) registers comes after the four, and
    counts in the total."""
    c = ledger_counts(run=labelled["run"])
    before = c.total
    c.more["evaluation_vote"] = 3
    assert [s for s, _, _ in c.states()][-1] == "evaluation_vote" and c.total == before + 3
    assert c.line().endswith("3 evaluation votes: not trained")
    ledger.ledger_state_add(state="evaluation_vote", words="again")  # idempotent
    assert [s for s, _ in STATE_LINE].count("evaluation_vote") == 1
