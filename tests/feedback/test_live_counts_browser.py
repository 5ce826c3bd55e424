"""The annotation header's "N ratings · M late · W waiting for you" moves live, in a real
browser against a real server (issue #31, item 1): another annotator's label, late or not,
and new rollouts change it without a reload, to the numbers the other pages show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Assignment, Feedback
from apps.feedback.handout.queue import annotation_waiting
from apps.feedback.handout.lease import assignment_claim
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user
from tests.feedback.conftest import login, worker_write
from tests.servers import HeldAnswer

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _group(run: Run, name: str) -> list[Experience]:
    rows = [experience_row(run, key=f"{name}-{i}", group=name, status="pending", reward=None, auto_reward=0.5,
                           response_text=f"answer {name}.{i}") for i in range(4)]
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


def _text(page: Any, selector: str) -> str:
    return str(page.inner_text(selector)).strip()


def _waits_for(page: Any, selector: str, value: str) -> None:
    page.wait_for_function(f"() => (document.querySelector('{selector}') || {{}}).textContent === '{value}'",
                           timeout=20_000)


def test_the_annotation_header_counts_move_live(page: Any, live_url: str, owner: User, annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1}, reward_model={"enabled": True})
    add_member(run, annotator)
    bob = make_user("bob")
    add_member(run, bob)
    _group(run, "first")
    _group(run, "second")
    bobs = assignment_claim(run=run, annotator=bob, size=4)  # the freshest group: bob's
    path = f"/runs/{run.pk}/annotate/"
    login(page, live_url, "annotator", next_path=path)
    page.wait_for_url(f"**{path}")
    page.wait_for_selector("#annotate[data-live=open]")
    assert (_text(page, "#feedback-count"), _text(page, "#late-count"), _text(page, "#waiting-count")) == ("0", "0", "4")
    assert "late labels teach the reward model" in _text(page, "#annotate-counts")

    # Bob rates one of his items: the ratings count moves on the annotator's page.
    web = Client()
    web.force_login(bob)
    assert web.post(f"/runs/{run.pk}/annotate/items/{bobs[0].pk}/rate/", {"score": "5"}).status_code == 302
    _waits_for(page, "#feedback-count", "1")
    assert _text(page, "#late-count") == "0"

    # His group trains before he rates the next one: a late label, counted live as late.
    Experience.objects.filter(group_id=bobs[0].experience.group_id).update(status="consumed")
    assert web.post(f"/runs/{run.pk}/annotate/items/{bobs[1].pk}/rate/", {"score": "1"}).status_code == 302
    _waits_for(page, "#feedback-count", "2")
    _waits_for(page, "#late-count", "1")

    # A rollout worker writes a new group: the waiting count follows, to the number the
    # other pages (and the API) give her at that moment.
    rows = [{"key": f"third-{i}", "group_id": "third", "status": "pending", "auto_reward": 0.5,
             "prompt_text": "What is 3 + 3?", "response_text": f"answer third.{i}"} for i in range(4)]
    worker_write(run.pk, rows)
    _waits_for(page, "#waiting-count", "8")
    assert annotation_waiting(run=run, annotator=annotator) == 8
    assert Assignment.objects.filter(annotator=annotator, status="leased").count() == 8


def _bob_beside_the_annotator(owner: User, annotator: User, **options: Any) -> tuple[Run, Client, list[Assignment]]:
    """A run with one group, the annotator and bob on it; bob holds the group's items and is
    logged in to the web (his Client)."""
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1}, **options)
    add_member(run, annotator)
    bob = make_user("bob")
    add_member(run, bob)
    _group(run, "first")
    bobs = assignment_claim(run=run, annotator=bob, size=4)
    web = Client()
    web.force_login(bob)
    return run, web, bobs


def _open_annotation(page: Any, live_url: str, run: Run) -> None:
    path = f"/runs/{run.pk}/annotate/"
    login(page, live_url, "annotator", next_path=path)
    page.wait_for_url(f"**{path}")
    page.wait_for_selector("#annotate[data-live=open]")


def _rate(web: Client, run: Run, item: Assignment, score: str) -> None:
    assert web.post(f"/runs/{run.pk}/annotate/items/{item.pk}/rate/", {"score": score}).status_code == 302


def _label_while_held(page: Any, counts: HeldAnswer, rate: Callable[[], None], *, shown: str) -> None:
    """A label (`rate`) while the counts' first answer is held: its event moves the header to
    `shown` at once and asks for a refresh, which must wait for the held answer and then run,
    within 5 s (the poll, every 10 s from the swap, is not what brings it)."""
    rate()
    _waits_for(page, "#feedback-count", shown)
    page.wait_for_timeout(600)  # the refresh is asked for 300 ms after the last event
    assert len(counts.asked) == 1
    counts.release()
    assert counts.wait_asked(1, ms=5_000), "the label's refresh, asked for while the counts were on their way, never ran"
    _waits_for(page, "#feedback-count", shown)


def test_a_label_that_comes_while_the_counts_are_on_their_way_still_counts(
        page: Any, live_url: str, owner: User, annotator: User) -> None:
    """Bob's first label refreshes the annotator's header; his second comes before that answer
    has arrived. The answer (read after the first) replaces the refresh link, and the refresh
    the second asked for still runs after it: the header says 2, not the held answer's 1
    until the 10 s poll."""
    run, web, bobs = _bob_beside_the_annotator(owner, annotator, reward_model={"enabled": True})
    _open_annotation(page, live_url, run)
    counts = HeldAnswer(page, rf"/runs/{run.pk}/annotate/counts/")
    _rate(web, run, bobs[0], "5")
    assert counts.wait_asked(ms=15_000), "bob's label did not refresh the counts"
    _label_while_held(page, counts, lambda: _rate(web, run, bobs[1], "1"), shown="2")
    assert Feedback.objects.filter(run=run, kind="rating").count() == 2


# The counts' refresh link once static/rftweb/refresh.js has set its poll's timer.
POLLING = "#counts-refresh[data-polling]"


def test_a_label_that_comes_while_the_counts_own_poll_is_on_its_way_still_counts(
        page: Any, live_url: str, owner: User, annotator: User) -> None:
    """The header also refreshes itself every 10 s. Bob's label comes while that poll's answer
    (read before the label) is on its way: the refresh the label asks for runs after it (an
    htmx "every 10s" on the link was a request of its own, which dropped the label's refresh and
    left the header at the poll's older count until the next poll). The page's clock is
    Playwright's, so the poll is due at once, not in 10 s."""
    run, web, bobs = _bob_beside_the_annotator(owner, annotator)
    page.clock.install()
    _open_annotation(page, live_url, run)
    counts = HeldAnswer(page, rf"/runs/{run.pk}/annotate/counts/")
    page.wait_for_selector(POLLING, state="attached")  # its timer is set
    page.clock.fast_forward(10_000)
    assert counts.wait_asked(ms=15_000), "the counts did not poll"
    _label_while_held(page, counts, lambda: _rate(web, run, bobs[0], "5"), shown="1")
    # The link the answer brought polls on (once htmx has settled it in: its timer is set).
    page.wait_for_selector(POLLING, state="attached")
    page.clock.fast_forward(10_000)
    assert counts.wait_asked(2, ms=15_000), "the counts stopped polling after their refresh"
