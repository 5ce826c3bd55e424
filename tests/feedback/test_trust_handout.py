"""Trust-aware hand-out (`feedback.trust`): a new annotator rates gold items first, so trust is
measured within their first labels; an untrusted annotator gets gold items and few or no fresh
items, which stay for trusted annotators. Seen through the annotation page, as people see it.

Personas: Olga owns the run and marked gold items; Carol rates carefully; Randy answers at
random (here: always wrong, so the test is deterministic)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.envapi.services import api_key_create
from apps.feedback.models import Assignment
from apps.rewards.models import GoldItem, RewardModel, RewardModelScore
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run, make_user

pytestmark = pytest.mark.django_db

GOLD = 6


def _run(olga: User, **trust: Any) -> Run:
    return make_run(owner=olga, reward_model={"enabled": True}, feedback={
        "mode": "blend", "overlap": 1, "rater_weighting": "gold", "gold_rate": 0.2,
        "selection": {"uncertainty": 1.0, "random_share": 0.0, "pairs": True},
        "trust": {"gold_first": 3, "untrusted_share": 0.0, **trust}})


def _items(run: Run, olga: User, *, groups: int = 10) -> tuple[set[int], set[int]]:
    """Groups of 4 completions (member 0 right, scored high; the rest wrong) and GOLD more
    completions, each its own group, that Olga marked gold with the right rating 1 (wrong)."""
    rm = RewardModel.objects.create(run=run, version=1, path="/nowhere", base="x", accuracy=0.9)
    rows = [experience_row(run, key=f"g{g}-{i}", group=f"g{g}", status="pending", reward=None, auto_reward=0.5,
                           response_text="<answer>right</answer>" if i == 0 else f"<answer>wrong {i}</answer>")
            for g in range(groups) for i in range(4)]
    rows += [experience_row(run, key=f"solo{k}", group=f"solo{k}", status="pending", reward=None, auto_reward=0.5,
                            response_text=f"<answer>wrong solo {k}</answer>") for k in range(GOLD)]
    exps = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    fresh, gold = exps[:-GOLD], exps[-GOLD:]
    RewardModelScore.objects.bulk_create([
        RewardModelScore(experience=e, reward_model=rm, score=0.45 if "right" in e.response_text else -0.4)
        for e in fresh])
    for e in gold:
        GoldItem.objects.create(run=run, experience=e, answer=0.0, created_by=olga)
    return {e.pk for e in fresh}, {e.pk for e in gold}


class Annotator:
    """A person at the annotation page: opens it (which hands out their queue) and rates."""

    def __init__(self, run: Run, user: User, *, careful: bool) -> None:
        self.run, self.user, self.careful = run, user, careful
        self.client = Client()
        self.client.force_login(user)

    def open_page(self) -> tuple[list[Assignment], str]:
        page = self.client.get(f"/runs/{self.run.pk}/annotate/")
        assert page.status_code == 200
        queue = list(Assignment.objects.filter(run=self.run, annotator=self.user, status="leased")
                     .select_related("experience").order_by("id"))
        return queue, page.content.decode()

    def rate_all(self) -> list[Assignment]:
        queue, _ = self.open_page()
        for a in queue:
            right = "right" in a.experience.response_text
            # Carol: 5 for a right answer, 1 for a wrong one; Randy the opposite.
            score = ("5" if right else "1") if self.careful else ("1" if right else "5")
            r = self.client.post(f"/runs/{self.run.pk}/annotate/items/{a.pk}/rate/", {"score": score},
                                 HTTP_HX_REQUEST="true")
            assert r.status_code == 200
            assert "gold" not in r.content.decode().lower()
        return queue


def _people(run: Run) -> tuple[Annotator, Annotator]:
    carol, randy = make_user("carol"), make_user("randy")
    add_member(run, carol)
    add_member(run, randy)
    return Annotator(run, carol, careful=True), Annotator(run, randy, careful=False)


def test_a_new_annotators_first_page_is_gold_items_only_and_never_says_so(olga: User) -> None:
    run = _run(olga)
    fresh, gold = _items(run, olga)
    carol, _ = _people(run)
    queue, html = carol.open_page()
    # Three gold items, nothing else, until Carol is measured (without trust: 8 mixed items).
    assert len(queue) == 3 and {a.experience_id for a in queue} <= gold
    assert "gold" not in html.lower()
    # Opening the page again hands out nothing more while the gold items wait in her queue.
    again, _ = carol.open_page()
    assert [a.pk for a in again] == [a.pk for a in queue]


def test_once_measured_the_careful_rater_gets_the_uncertain_pairs_and_the_random_one_gold_only(olga: User) -> None:
    run = _run(olga)
    fresh, gold = _items(run, olga)
    carol, randy = _people(run)
    assert {a.experience_id for a in carol.rate_all()} <= gold
    assert {a.experience_id for a in randy.rate_all()} <= gold

    # Carol, right on her 3 gold items, is trusted: her page holds the rule's pairs, each a
    # right and a wrong sibling first in each group (the pair straddling the reward model's decision).
    queue, _ = carol.open_page()
    mine = [a.experience for a in queue if a.experience_id in fresh]
    assert len(mine) >= 6
    pairs = list(zip(mine[0::2], mine[1::2], strict=False))
    assert all(a.group_id == b.group_id for a, b in pairs)
    firsts = [p for i, p in enumerate(pairs) if p[0].group_id not in {q[0].group_id for q in pairs[:i]}]
    assert all(("right" in a.response_text) != ("right" in b.response_text) for a, b in firsts)

    # Randy, wrong on his, is untrusted: his page holds only the gold items he has not seen.
    queue, html = randy.open_page()
    assert queue and {a.experience_id for a in queue} <= gold
    assert "gold" not in html.lower()
    randy.rate_all()
    # With the gold items used up his page is empty, though fresh items are still waiting...
    assert randy.open_page()[0] == []
    waiting = Experience.objects.filter(pk__in=fresh).exclude(assignments__isnull=False).count()
    assert waiting > 0
    # ...for Carol, who keeps getting them.
    carol.rate_all()
    assert [a for a in carol.open_page()[0] if a.experience_id in fresh]

    # The owner sees each rater's standing on the Raters page and in the API.
    owner = Client()
    owner.force_login(olga)
    page = owner.get(f"/runs/{run.pk}/signal/raters/").content.decode()
    assert 'id="trust-handout"' in page and "3 gold items first" in page and "gold items only" in page
    standings = {r["rater"]: r["standing"] for r in owner.get(f"/runs/{run.pk}/signal/raters.json").json()["raters"]}
    assert standings == {"carol": "trusted", "randy": "untrusted"}
    _, raw = api_key_create(name="env", runs=[run], actions=["read"], rate_limit_per_minute=1000)
    api = Client().get(f"/api/v1/runs/{run.pk}/raters", headers={"Authorization": f"Bearer {raw}"}).json()
    assert {r["rater"]: r["standing"] for r in api["raters"]} == standings
    assert api["trust"] == {"gold_first": 3, "untrusted_share": 0.0}


def test_an_untrusted_rater_keeps_the_configured_share_of_fresh_items(olga: User) -> None:
    run = _run(olga, untrusted_share=0.5)
    fresh, gold = _items(run, olga, groups=12)
    _, randy = _people(run)
    randy.rate_all()  # his 3 gold items, wrong: untrusted
    randy.rate_all()  # the other 3 gold items (they come first)
    queue, _ = randy.open_page()
    # Half of a full queue (8): 4 fresh items, as two sibling pairs.
    assert len([a for a in queue if a.experience_id in fresh]) == 4


def test_the_run_page_shows_the_trust_settings(olga: User) -> None:
    run = _run(olga)
    owner = Client()
    owner.force_login(olga)
    panel = owner.get(f"/runs/{run.pk}/signal/reward-model/", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="trust-handout"' in panel and "<b>3</b> gold items first" in panel and "gold items only" in panel


@pytest.mark.parametrize(("fields", "field", "message"), [
    ({"feedback.rater_weighting": "off", "feedback.trust.untrusted_share": "0"}, "feedback.trust.untrusted_share",
     "needs rater_weighting gold or agreement"),
    ({"feedback.rater_weighting": "agreement", "feedback.trust.gold_first": "3"}, "feedback.trust.gold_first",
     "needs rater_weighting gold"),
    ({"feedback.rater_weighting": "gold", "feedback.trust.untrusted_share": "1.5"}, "feedback.trust.untrusted_share",
     "Untrusted share must be at most 1"),
])
def test_a_trust_setting_that_cannot_work_is_refused_naming_its_field(olga: User, fields: dict[str, str], field: str,
                                                                     message: str) -> None:
    run = make_run(owner=olga)
    before = dict(run.config["feedback"])
    owner = Client()
    owner.force_login(olga)
    response = owner.post(f"/runs/{run.pk}/feedback-settings/", {"confirm": "yes", "feedback.mode": "blend", **fields},
                          HTTP_HX_REQUEST="true")
    assert response.status_code < 500
    html = response.content.decode()
    error = html[html.index(f'id="error_{field}"'):]
    assert message in error[:300]
    run.refresh_from_db()
    assert run.config["feedback"] == before


def test_standings_are_read_once_per_new_label_and_a_new_label_counts_at_once(olga: User) -> None:
    """Every claim asks for the annotator's standing, and working it out reads all of the
    run's feedback: asked again with nothing new, it is not worked out again; one more label
    (or gold item) and it is, so a standing is never stale."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.feedback.raters.reliability import rater_standing

    run = _run(olga)
    _, gold = _items(run, olga)
    carol, randy = _people(run)
    carol.rate_all()
    assert rater_standing(run=run, annotator_id=carol.user.pk) == "trusted"
    with CaptureQueriesContext(connection) as asked_again:
        assert rater_standing(run=run, annotator_id=carol.user.pk) == "trusted"
    assert not any("feedback_feedback" in q["sql"] and "COUNT" not in q["sql"] for q in asked_again.captured_queries)
    assert len(asked_again.captured_queries) == 2  # what the standings were worked out from

    assert rater_standing(run=run, annotator_id=randy.user.pk) == "unmeasured"
    randy.rate_all()  # wrong on every gold item
    assert rater_standing(run=run, annotator_id=randy.user.pk) == "untrusted"
