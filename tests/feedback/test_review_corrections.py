"""A correction on the review page (issue 64 item 3): the reviewer saw the original answer only,
while the corrected text was stored as an expert experience. Now both are shown, escaped, on the
page, and the API's label carries the correction's text."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.feedback.kinds.edit import feedback_edit
from apps.feedback.kinds.rating import feedback_rate
from tests.envapi.test_review_api import key_of
from tests.factories import add_member, experience_row, make_run, make_user
from tests.servers import login

CORRECTION = "The answer is **42**.\n\n<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">"


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_reviewer_sees_the_original_and_the_correction_side_by_side(page: Any, live_url: str, owner: User) -> None:
    from apps.buffer.services import experience_write

    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1}, algorithm="mix")
    annie = make_user("annie")
    add_member(run, annie)
    [pk] = experience_write(experiences=[experience_row(run, key="e-0", group="g", status="pending",
                                                        response_text="The answer is 41.")]).ids
    [other] = experience_write(experiences=[experience_row(run, key="e-1", group="g", status="pending",
                                                           response_text="Something else")]).ids
    fb, expert = feedback_edit(run=run, author=annie, experience=pk, text=CORRECTION)
    rating = feedback_rate(run=run, experience=other, score=3, author=annie)
    assert Experience.objects.get(pk=expert.pk).response_text == CORRECTION  # what the page must show

    review = f"/runs/{run.pk}/review/"
    login(page, live_url, "owner", next_path=review)
    page.wait_for_url(f"**{review}")
    row = page.locator(f"#label-{fb.pk}")
    expect(row.locator(".correction-pair .original")).to_contain_text("The answer is 41.")
    expect(row.locator(".correction-pair .original h3")).to_have_text(f"Original answer · #{pk}")
    expect(row.locator(".correction-pair .correction")).to_contain_text("The answer is 42.")
    expect(row.locator(".correction-pair .correction strong")).to_have_text("42")
    assert row.locator(".correction-pair script").count() == 0
    assert page.evaluate("() => window.__xss") is None
    # A label that writes no correction shows no such pair.
    expect(page.locator(f"#label-{rating.pk} .correction-pair")).to_have_count(0)
    # The API's label says the same.
    labels = {r["id"]: r for r in key_of(owner, run).get(f"/runs/{run.pk}/review/labels").json()}
    assert labels[fb.pk]["correction"] == CORRECTION and labels[rating.pk]["correction"] is None
