"""The review page in a real browser (issue 32 item 5): an owner on a phone and on a laptop rejects
a person's rating, sees the page say what it did, and the reward it moved moves back; resolves a
disagreement by keeping one side; an annotator is refused. Screenshots go to var/screenshots/
(ignored; with `make screenshots`) for a reviewer."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import Run
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
# The page helpers and the signed-in page opener of the other page tests.
from tests.dashboard.test_pages_round2 import LAPTOP, PHONE, no_sideways_scroll, open_page, shot  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def a_disputed_item() -> tuple[Run, dict[str, User], Experience, Feedback, Feedback]:
    owner = make_user("owner")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="reviewed in a browser",
                   feedback={"mode": "blend", "overlap": 2})
    annie, bea = make_user("annie"), make_user("bea")
    add_member(run, annie)
    add_member(run, bea)
    [item] = make_experiences(run, groups=1, group_size=1, status="pending", auto_reward=0.0,
                              response_text="<script>window.pwned = 1</script> The answer is " + "4" * 200)
    return (run, {"owner": owner, "annie": annie, "bea": bea}, item,
            feedback_rate(run=run, experience=item, score=5, author=annie),
            feedback_rate(run=run, experience=item, score=1, author=bea))


@pytest.mark.parametrize("size", [PHONE, LAPTOP], ids=["390", "1280"])
def test_an_owner_rejects_a_rating_and_sees_the_reward_it_moved_move_back(open_page: Any, size: dict[str, int]) -> None:
    run, people, item, _, beas = a_disputed_item()
    assert Experience.objects.get(pk=item.pk).human_reward == 0.5
    page = open_page(people["owner"], size)
    page.goto(f"/runs/{run.pk}/")
    page.click("nav.subnav >> text=Review labels")
    page.wait_for_url(f"**/runs/{run.pk}/review/")
    expect(page.locator("#review-counts")).to_contain_text("1 open disagreement")
    expect(page.locator("#disagreements")).to_contain_text("annie 5/5, bea 1/5")
    assert page.evaluate("() => window.pwned") is None  # model output is text, not code
    no_sideways_scroll(page)
    shot(page, "review")

    row = page.locator(f"#label-{beas.pk}")
    row.locator("form.reject button").click()
    expect(page.locator("#review-message")).to_contain_text("taken out of its group's reward")
    expect(page.locator(f"#label-{beas.pk}")).to_have_attribute("data-review", "rejected")
    expect(page.locator(f"#label-{beas.pk} .effect")).to_contain_text("Takes no effect")
    expect(page.locator("#review-counts")).to_contain_text("0 open disagreements")
    assert page.url.endswith(f"/runs/{run.pk}/review/")  # an HTMX swap, not a reload
    no_sideways_scroll(page)
    shot(page, "review-rejected")
    # The effect, where the run keeps it: bea's 1/5 no longer pulls the reward down.
    assert Experience.objects.get(pk=item.pk).human_reward == 1.0
    assert Feedback.objects.get(pk=beas.pk).reviewed_by == people["owner"]

    # The filters: only the rejected ones.
    page.select_option("select[name=status]", "rejected")
    page.click(".review-filters button[type=submit]")
    expect(page.locator(".review-row")).to_have_count(1)
    expect(page.locator(".review-row")).to_have_attribute("data-feedback", str(beas.pk))


def test_an_owner_keeps_one_side_of_a_disagreement_and_an_annotator_is_refused(open_page: Any) -> None:
    run, people, item, annies, beas = a_disputed_item()
    page = open_page(people["owner"], LAPTOP)
    page.goto(f"/runs/{run.pk}/review/")
    page.locator(f"#disagreements .side[data-feedback='{annies.pk}'] form.keep button").click()
    expect(page.locator("#review-message")).to_contain_text(f"Kept rating #{annies.pk}; rejected #{beas.pk}")
    expect(page.locator("#no-disagreements")).to_be_visible()
    shot(page, "review-resolved")
    assert Feedback.objects.get(pk=annies.pk).review == "accepted"
    assert Feedback.objects.get(pk=beas.pk).review == "rejected"

    annie = open_page(people["annie"], PHONE)
    response = annie.goto(f"/runs/{run.pk}/review/")
    assert response is not None and response.status == 403


def test_on_a_phone_an_owner_resolves_a_disagreement_with_their_own_rating(open_page: Any) -> None:
    run, people, item, annies, beas = a_disputed_item()
    page = open_page(people["owner"], PHONE)
    page.goto(f"/runs/{run.pk}/review/")
    page.click("#disagreements details.own-label > summary")
    form = page.locator("#disagreements form.own-rating").first
    expect(form).to_be_visible()
    no_sideways_scroll(page)
    shot(page, "review-own-label")
    form.locator("select[name=score]").select_option("4")
    form.locator("button[type=submit]").click()
    expect(page.locator("#review-message")).to_contain_text(f"rejected #{beas.pk}")
    expect(page.locator("#no-disagreements")).to_be_visible()
    mine = Feedback.objects.get(run=run, author=people["owner"])
    assert mine.review == "accepted" and mine.value["score"] == 4
    assert Feedback.objects.get(pk=beas.pk).review == "rejected"
    assert Feedback.objects.get(pk=annies.pk).review == "pending"  # 5/5 agrees with 4/5
    assert Experience.objects.get(pk=item.pk).human_reward == (1.0 + 0.75) / 2
