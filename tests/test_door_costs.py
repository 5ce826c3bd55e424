"""The annotator's doors read and write the database a fixed number of times a request, as
many for a team's run as for a small one (issue #49 item 5): under bench/web_load's 200
people every statement is a round trip each request waits for, and Postgres shares the
host's cores with the web processes. Each door of bench/web_load's annotator is walked as a
person walks it (bench/door_costs.walk: through the whole middleware chain, the templates
and the context processors), with real commits, so what runs after a commit (a label's hold
renewal) is counted too.

The ceilings are today's counts, exactly: a statement more is a regression to explain (and
this file to update, with the reason); bench/door_costs prints them with the CPU of each."""

from __future__ import annotations

from typing import Any

import pytest

from bench.door_costs import DOORS, Costs, costs_measure, team_build

# 2026-11-26, before -> after (issue #49 item 5): the header's badge is counted only where the
# header is shown (every fragment: -1); the annotation page takes what waits for the person
# from the queue it has just read (-1); a hold renewal that would move no hold by more than
# apps.feedback.handout.holds.RENEW_SLACK_SECONDS reads once and writes nothing (the counts right
# after a label: -6), and that read is the queue's count (-1).
# 2026-11-28 (issue 62 item 1): active selection is the run config's default, so a team's run
# hands out under the rule (its candidates' reward-model scores, the random share's count, the
# gold items): the annotate page 31 -> 42, the counts 7 -> 9 (what waits, counted as the rule
# would hand it out), the queue's top-up 22 -> 31. A run in arrival order costs what it did.
CEILINGS = {
    "GET login": 0,
    "POST login": 18,  # django-axes' checks and log, the session's row, last_login
    "GET annotate page": 46,  # 34 -> 33 -> 30: the hand-out, the hold renewal, the counts, the ledger
    # (round 49: the person's ledger is one statement counted in the database, not their labels,
    # the versions, reward models and experiences read one after another); 31 (round 61): the
    # blind evaluations waiting for the person's vote (apps.evaluation), one statement; 33
    # (issue 63 item 2): whether a blind evaluation hands out pairs between the items
    # (apps.feedback.extras: one exists(); the pairs themselves only where one does), and the
    # person's evaluation votes counted for "your submissions" ("N evaluation votes: not trained");
    # 35 (issue 64 item 1): each of "Your submissions"' labels shows its state (apps.feedback.ledger's
    # label_states: what the reward model recorded of them, and their experiences; the versions
    # only where one is trained); +11 (issue 62 item 1, above): the hand-out under the default rule
    "GET counts": 9,  # 15: a renewal's 7 (right after a label: within the slack, one read, which also
    # counts the person's queue for what waits for them) and the counts
    "POST rate": 22,  # 21 -> 20: the rating's transaction and its hold renewal after the commit; 22
    # (issue 64 item 1): the finished card shows the label's state (label_states, as above)
    "GET queue": 32,  # 23: the top-up's hand-out and hold renewal; 22, then 23 (issue 63 item 2):
    # whether a blind evaluation hands out pairs between the items it tops up (one exists()); +9
    # (issue 62 item 1, above): the top-up under the default rule
    "GET rank": 6,  # 7
    "POST rank": 23,  # 24; the second ranking of a group with overlap 2 also marks it ready
}

pytestmark = pytest.mark.django_db(transaction=True)  # commits: what runs after one is counted


def _walked(*, people: int, runs: int, groups: int, walkers: int) -> Costs:
    team = team_build(people=people, runs=runs, groups=groups, prefix=f"t{people}")
    return costs_measure(team, walkers)


def test_every_annotator_door_stays_within_its_statements_on_a_teams_run() -> None:
    # A team: three runs of 240 completions, 24 annotators on each, a label from each.
    costs = _walked(people=24, runs=3, groups=60, walkers=3)
    counted = {door: max(costs[door].statements) for door in DOORS}
    over = {door: (n, CEILINGS[door]) for door, n in counted.items() if n > CEILINGS[door]}
    assert not over, f"doors over their ceilings (statements, ceiling): {over}; all: {counted}"


def test_a_teams_run_costs_each_door_what_a_small_run_costs() -> None:
    small = _walked(people=2, runs=1, groups=6, walkers=2)
    team = _walked(people=24, runs=3, groups=60, walkers=2)
    for door in DOORS:
        assert max(small[door].statements) == max(team[door].statements), (door, small[door].statements,
                                                                            team[door].statements)


def test_the_counts_right_after_a_label_renew_no_hold_and_later_counts_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime, timedelta

    from django.contrib.auth.models import User
    from django.test import Client
    from django.utils import timezone

    from apps.feedback.handout.holds import HOLDS_PER_PERSON, RENEW_SLACK_SECONDS
    from apps.feedback.models import Assignment
    from apps.feedback.handout.lease import assignment_claim
    from apps.runs.models import Run

    team = team_build(people=1, runs=1, groups=4, prefix="holds")
    run, anna = Run.objects.get(pk=team.run_id), User.objects.get(username=team.people[0])
    at = [timezone.now()]
    monkeypatch.setattr(timezone, "now", lambda: at[0])
    assignment_claim(run=run, annotator=anna, size=4)  # a sign of work: the holds renewed

    def holds() -> set[datetime | None]:
        """The holds of the items on top of her queue (apps.feedback.handout.holds.HOLDS_PER_PERSON);
        the items below them hold nothing."""
        leased = Assignment.objects.filter(run=run, annotator=anna, status="leased").order_by("id")
        assert set(leased[HOLDS_PER_PERSON:].values_list("held_until", flat=True)) <= {None}
        return set(leased[:HOLDS_PER_PERSON].values_list("held_until", flat=True))

    client = Client()
    client.force_login(anna)
    renewed = holds()
    assert len(renewed) == 1 and None not in renewed
    at[0] += timedelta(seconds=RENEW_SLACK_SECONDS / 2)
    assert client.get(f"/runs/{run.pk}/annotate/counts/", HTTP_HX_REQUEST="true").status_code == 200
    assert holds() == renewed  # seconds later: nothing to renew
    at[0] += timedelta(seconds=RENEW_SLACK_SECONDS)
    assert client.get(f"/runs/{run.pk}/annotate/counts/", HTTP_HX_REQUEST="true").status_code == 200
    (before,), (after,) = renewed, holds()
    assert before is not None and after is not None and after - before == timedelta(seconds=1.5 * RENEW_SLACK_SECONDS)


def _page_read(client: Any, url: str) -> tuple[int, int, str]:
    """(statements, rows the database sent back, the page) of one load of `url`."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    rows = [0]

    def counted(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        result = execute(sql, params, many, context)
        rows[0] += max(context["cursor"].rowcount, 0)
        return result

    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(counted):
        page = client.get(url)
    assert page.status_code == 200
    return len(queries.captured_queries), rows[0], page.content.decode()


def test_the_annotation_pages_ledger_reads_the_same_however_many_labels_the_run_has() -> None:
    """Issue #49 item 5: the annotation page's ledger (the person's labels and the run's) is
    counted in the database. The page runs as many statements and reads as many rows when the
    run's labels, the person's own among them, grow fourfold; the counts it shows grow with
    them, derived from the rows."""
    import re

    from django.contrib.auth.models import User
    from django.test import Client

    from apps.buffer.models import Experience
    from apps.feedback.kinds.ranking import feedback_rank
    from apps.feedback.kinds.rating import feedback_rate
    from apps.feedback.models import Feedback
    from apps.runs.models import Run

    team = team_build(people=3, runs=1, groups=70, prefix="ledger")
    run = Run.objects.get(pk=team.run_id)
    viewer, *others = [User.objects.get(username=name) for name in team.people]
    client = Client()
    client.force_login(viewer)
    url = f"/runs/{run.pk}/annotate/"
    client.get(url)  # the first load hands the queue out
    # Labels on groups outside the viewer's queue: the viewer's ratings, the others' ratings
    # and rankings (a ranking's trained-on experiences are the ids its value holds).
    queued = set(run.assignments.filter(annotator=viewer).values_list("experience__group_id", flat=True))
    groups = list(dict.fromkeys(Experience.objects.filter(run=run).exclude(group_id__in=queued)
                                .order_by("id").values_list("group_id", flat=True)))

    def label(some: list[str]) -> tuple[int, int]:
        for group in some:
            members = list(Experience.objects.filter(run=run, group_id=group).order_by("id"))
            feedback_rate(run=run, experience=members[0], score=4, author=viewer)
            feedback_rate(run=run, experience=members[-1], score=2, author=others[0])
            feedback_rank(run=run, order=[m.pk for m in members], author=others[1])
        return Feedback.objects.filter(run=run).count(), Feedback.objects.filter(run=run, author=viewer).count()

    fewer = label(groups[:12])  # more than the page's latest submissions (10) already
    before = _page_read(client, url)
    more = label(groups[12:48])
    assert more[0] >= 3 * fewer[0] and more[1] >= 3 * fewer[1]
    after = _page_read(client, url)
    assert after[:2] == before[:2], (before[:2], after[:2])
    for (everyone, mine), (_, _, page) in ((fewer, before), (more, after)):
        shown_mine = re.search(r'id="ledger-mine" data-total="(\d+)"', page)
        shown_run = re.search(r'id="ledger-run" data-total="(\d+)"', page)
        assert shown_mine and int(shown_mine.group(1)) == mine
        assert shown_run and int(shown_run.group(1)) == everyone
