"""Annotation ergonomics (issue 17) in a real browser against a real server: A/B by keys,
ranking that cannot be saved unordered (keyboard and drag), undo and revision while a group
is untrained, guidelines and the hidden automatic reward, progress, and values people read.
A screenshot of the annotation page goes to var/screenshots/ (ignored; with `make screenshots`)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Assignment, Feedback
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run
from tests.servers import BROWSER_WAIT_MS, HeldAnswer, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GUIDELINES = "**Prefer** short answers.\n\n<script>window.__xss = 1</script>\n\n- one\n- two"


def _group(run: Run, group: str, autos: list[float]) -> list[Experience]:
    rows = [experience_row(run, key=f"{group}-{i}", group=group, status="pending", auto_reward=a, reward=None,
                           response_text=f"Answer {group}-{i}") for i, a in enumerate(autos)]
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


def _open(page: Any, live_url: str, run: Run, username: str = "annotator") -> None:
    path = f"/runs/{run.pk}/annotate/"
    login(page, live_url, username, next_path=path)
    page.wait_for_url(f"**{path}")
    page.wait_for_selector("#annotate[data-live=open]")


@pytest.fixture
def blend_run(owner: User, annotator: User) -> Run:
    run = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.5, "w_human": 0.5, "guidelines": GUIDELINES,
                                          "daily_target": 10})
    add_member(run, annotator)
    return run


def test_a_b_comparison_by_keys(page: Any, live_url: str, blend_run: Run, annotator: User) -> None:
    members = _group(blend_run, "g", [1.0, 0.0, 0.5])
    _open(page, live_url, blend_run)
    # htmx wires up a swapped-in panel only when its swap settles (20 ms by default); a key
    # pressed before then used to submit the plain form and leave the page (round 5's flaky
    # tie). A slow settle makes that window wide enough to hit every time.
    page.evaluate("() => { htmx.config.defaultSettleDelay = 1000; }")
    page.keyboard.press("c")
    page.wait_for_selector("#panel form.compare")
    page.keyboard.press("b")
    page.wait_for_selector("#panel .saved")
    fb = Feedback.objects.get(kind="pairwise", author=annotator)
    assert (fb.experience_id, fb.other_id, fb.value["winner"]) == (members[0].pk, members[1].pk, "b")
    # The compared item looks different in the queue.
    page.wait_for_selector(f'#queue .item.has-pairwise[data-experience="{members[0].pk}"]')
    page.keyboard.press("c")
    page.wait_for_selector("#panel form.compare")
    page.keyboard.press("t")
    page.wait_for_selector("#panel .saved:has-text('tie')")
    assert page.url.endswith(f"/runs/{blend_run.pk}/annotate/")  # still the page, swapped in place
    assert list(Feedback.objects.filter(kind="pairwise").order_by("id").values_list("value__winner", flat=True)) == ["b", "tie"]


def test_a_ranking_starts_unranked_and_is_saved_only_when_ordered_by_drag(page: Any, live_url: str, blend_run: Run,
                                                                         annotator: User) -> None:
    members = _group(blend_run, "g", [0.0, 0.0, 0.0])
    _open(page, live_url, blend_run)
    # A panel htmx wires up only when its swap settles saved the ranking as a plain POST and
    # reloaded the page (seen in CI under load): a settle that never comes keeps that window open.
    page.evaluate("() => { htmx.config.defaultSettleDelay = 60000; }")
    page.keyboard.press("r")
    page.wait_for_selector("#panel form.rank[data-complete='0']")
    page.evaluate("() => { htmx.config.defaultSettleDelay = 20; }")  # the saved answer's swap settles
    assert page.locator("#panel ul.unranked .rank-item").count() == 3
    assert page.is_disabled("#panel .rank-save")
    # Drag the last completion onto the first place, then the first by click (it takes the
    # first free place, and the last one left places itself).
    page.drag_and_drop(f'#panel .rank-item[data-experience="{members[2].pk}"]', "#panel .rank-slot[data-place='1']")
    page.wait_for_function("() => document.querySelectorAll('#panel ol.ranked .rank-item').length === 1")
    assert page.is_disabled("#panel .rank-save")
    page.click(f'#panel .rank-item[data-experience="{members[0].pk}"] .completion')
    page.wait_for_selector("#panel form.rank[data-complete='1']")
    # Alt+Up moves the focused one up: members[1] before members[0].
    page.focus(f'#panel .rank-item[data-experience="{members[1].pk}"]')
    page.keyboard.press("Alt+ArrowUp")
    page.click("#panel .rank-save")
    page.wait_for_selector("#panel .saved")
    ranking = Feedback.objects.get(kind="ranking", author=annotator)
    assert ranking.value["order"] == [members[2].pk, members[1].pk, members[0].pk]
    page.wait_for_function("() => document.querySelectorAll('#queue .item.done').length === 3")
    screenshot(page, "annotate-after-ranking")


def test_the_server_refuses_an_unordered_ranking(blend_run: Run, annotator: User) -> None:
    members = _group(blend_run, "g", [0.0, 0.0])
    client = Client()
    client.force_login(annotator)
    url = f"/runs/{blend_run.pk}/annotate/experiences/{members[0].pk}/rank/"
    response = client.post(url, {f"rank_{members[0].pk}": "1", f"rank_{members[1].pk}": ""}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and f"give completion #{members[1].pk} a rank" in response.content.decode()
    assert not Feedback.objects.filter(kind="ranking").exists()


def test_undo_takes_back_the_last_rating_and_the_item_returns(page: Any, live_url: str, blend_run: Run,
                                                              annotator: User) -> None:
    members = _group(blend_run, "g", [1.0, 0.0])
    _open(page, live_url, blend_run)
    assert (page.inner_text("#done-today"), page.inner_text("#waiting-count")) == ("0", "2")
    for n, score in enumerate(("5", "1"), start=1):
        page.keyboard.press(score)
        page.keyboard.press("Enter")
        page.wait_for_function(f"() => document.querySelectorAll('#queue .item.done').length === {n}")
    # Both rated: the group is trainable with blended rewards.
    assert set(Experience.objects.filter(group_id="g").values_list("status", flat=True)) == {"ready"}
    page.wait_for_function("() => document.querySelector('#done-today').textContent === '2'")
    # Progress: done today against the owner's target, and what waits.
    page.wait_for_function("() => document.querySelector('#waiting-count').textContent === '0'")
    assert page.eval_on_selector("#target-bar", "b => [b.value, b.max]") == [2, 10]

    page.keyboard.press("z")
    page.wait_for_selector("#mine .saved")
    assert f"Withdrawn: your rating on #{members[1].pk}" in page.inner_text("#mine .saved")
    assert list(Feedback.objects.filter(kind="rating").values_list("experience_id", flat=True)) == [members[0].pk]
    second = Experience.objects.get(pk=members[1].pk)
    assert (second.status, second.human_reward, second.reward) == ("pending", None, None)
    assert Assignment.objects.get(experience=second, annotator=annotator).status == "leased"
    # The item comes back to the queue, open, and can be rated again.
    page.wait_for_selector(f'#queue .item:not(.done)[data-experience="{members[1].pk}"]')
    page.wait_for_function("() => document.querySelector('#done-today').textContent === '1'")
    page.wait_for_function("() => document.querySelector('#waiting-count').textContent === '1'")
    # A reload agrees with what the page counted live.
    page.reload()
    page.wait_for_selector("#annotate[data-live=open]")
    assert (page.inner_text("#done-today"), page.inner_text("#waiting-count")) == ("1", "1")


def test_a_submission_is_revisable_from_my_history_until_its_group_is_trained(page: Any, live_url: str, blend_run: Run,
                                                                             annotator: User) -> None:
    other = _group(blend_run, "h", [1.0])
    members = _group(blend_run, "g", [1.0, 0.0])  # the fresher group: first in the queue
    _open(page, live_url, blend_run)
    page.keyboard.press("4")
    page.keyboard.press("Enter")
    # The list follows the label's live event (rating, event, socket, refresh): under the whole
    # suite's load on two cores that chain once took over the default 15 s.
    page.wait_for_selector("#mine li.submission", timeout=40_000)
    item = page.locator("#mine li.submission").first
    assert "4/5" in item.inner_text() and "{" not in item.inner_text()  # no Python reprs
    page.keyboard.press("2")
    page.keyboard.press("Enter")
    expect(page.locator("#mine li.submission")).to_have_count(2, timeout=BROWSER_WAIT_MS)
    # Withdraw the older one (undo is for the last): its item comes back, open, and is rated again.
    first = Feedback.objects.get(experience=members[0])
    page.click(f'#mine li.submission[data-feedback="{first.pk}"] button')
    page.wait_for_selector(f'#queue .item:not(.done)[data-experience="{members[0].pk}"]')
    assert Experience.objects.get(pk=members[0].pk).human_reward is None
    page.click(f'#queue .item[data-experience="{members[0].pk}"] input[name=score][value="5"]')
    page.click(f'#queue .item[data-experience="{members[0].pk}"] form.rate button[type=submit]')
    page.wait_for_selector(f'#queue .item.done[data-experience="{members[0].pk}"]')
    revised = Feedback.objects.get(experience=members[0])
    assert revised.value["score"] == 5 and revised.pk != first.pk
    assert Experience.objects.get(pk=members[0].pk).human_reward == 1.0  # 5 stars
    # A trainer claims the group: its feedback can no longer change.
    Experience.objects.filter(group_id="g").update(status="consumed")
    page.click("#mine a.refresh")
    page.wait_for_selector("#mine li.submission.trained")
    assert page.locator("#mine li.submission button").count() == 0
    client = Client()
    client.force_login(annotator)
    fb = Feedback.objects.get(experience=members[0])
    response = client.post(f"/runs/{blend_run.pk}/annotate/mine/", {"feedback": fb.pk}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and "trained on" in response.content.decode()
    assert Feedback.objects.filter(pk=fb.pk).exists()
    assert other  # the other group's item is still in the queue


def test_a_click_on_refresh_while_the_lists_live_refresh_is_on_its_way_still_shows_what_changed(
        page: Any, live_url: str, blend_run: Run) -> None:
    """The label's live event refreshes "my submissions"; that answer is read before the trainer
    claims the group and arrives after the person clicked "refresh". htmx queued the click on the
    link the answer then swapped out, and dropped it: the list stayed revisable (CI, stop 60).
    The click now runs once more after the answer in flight."""
    members = _group(blend_run, "g", [1.0, 0.0])
    _open(page, live_url, blend_run)
    mine = HeldAnswer(page, rf"/runs/{blend_run.pk}/annotate/mine/")
    page.keyboard.press("4")
    page.keyboard.press("Enter")
    page.wait_for_selector(f'#queue .item.done[data-experience="{members[0].pk}"]')
    # The label's event, then its refresh (seconds under load), read before the rows change.
    assert mine.wait_asked(), "the label's event did not refresh my submissions"
    Experience.objects.filter(group_id="g").update(status="consumed")
    page.click("#mine a.refresh")
    mine.release()
    page.wait_for_selector("#mine li.submission.trained", timeout=BROWSER_WAIT_MS)
    assert page.locator("#mine li.submission button").count() == 0


def test_guidelines_are_shown_safely_and_the_automatic_reward_is_hidden_unless_the_owner_shows_it(
        page: Any, live_url: str, blend_run: Run, owner: User) -> None:
    _group(blend_run, "g", [0.75, 0.25])
    _open(page, live_url, blend_run)
    guide = page.locator("#guidelines")
    assert guide.locator("strong").inner_text() == "Prefer"
    assert guide.locator("li").count() == 2
    assert page.evaluate("window.__xss") is None and guide.locator("script").count() == 0
    assert page.locator("#queue .auto-reward").count() == 0
    assert "0.750" not in page.inner_text("#queue")
    assert "of 10" in page.inner_text("#progress")
    assert "good" in page.inner_text("#queue .item >> nth=0")  # text beside the thumbs, not emoji alone
    screenshot(page, "annotate")

    from apps.runs.services import run_feedback_settings_update

    run_feedback_settings_update(run=blend_run, feedback={**blend_run.config["feedback"], "show_auto_reward": True},
                               actor=owner)
    page.reload()
    page.wait_for_selector("#queue .auto-reward")
    assert page.locator("#queue .auto-reward").first.inner_text() == "0.750"
