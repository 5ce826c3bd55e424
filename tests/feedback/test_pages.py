"""The annotation page in a real browser against a real server (daphne, Postgres, Redis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.models import Feedback
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run
from tests.feedback.conftest import login, worker_write
from tests.servers import BROWSER_WAIT_MS, EVENT_WAIT_S

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _pending_group(run: Run, group: str, autos: list[float], texts: list[str] | None = None) -> list[Experience]:
    rows = [
        experience_row(run, key=f"{group}-{i}", group=group, status="pending", auto_reward=a, reward=None,
                       response_text=(texts[i] if texts else f"Answer {group}-{i}: **{i}**"))
        for i, a in enumerate(autos)
    ]
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


def _open_annotate(page: Any, live_url: str, run: Run, username: str) -> None:
    path = f"/runs/{run.pk}/annotate/"
    login(page, live_url, username, next_path=path)
    page.wait_for_url(f"**{path}")
    page.wait_for_selector("#annotate[data-live=open]")


def test_an_annotator_rates_ranks_and_edits_live_rollouts(page: Any, live_url: str, owner: User, annotator: User) -> None:
    # Arrival order (the rule's random share would hand the items out in another order).
    run = make_run(owner=owner, feedback={"mode": "blend", "w_auto": 0.5, "w_human": 0.5, "overlap": 1,
                                          "selection": {"uncertainty": 0.0, "random_share": 0.0}})
    add_member(run, annotator)
    group_a = _pending_group(run, "ga", [1.0, 0.0, 1.0])
    _open_annotate(page, live_url, run, "annotator")
    page.evaluate("window.__sameDocument = true")
    assert page.locator("#queue .item").count() == 3

    # A rollout worker writes a new group; it shows up without a reload.
    rows = [{"key": f"gb-{i}", "group_id": "gb", "status": "pending", "auto_reward": a, "prompt_text": "What is 2 + 2?",
             "response_text": f"Live answer {i}"} for i, a in enumerate([0.0, 1.0, 0.0])]
    group_b = worker_write(run.pk, rows)
    page.wait_for_selector(f'#queue .item[data-experience="{group_b[-1]}"]')
    assert page.get_by_text("Live answer 2").is_visible()
    assert page.locator("#live-count").inner_text() == "3"
    assert page.evaluate("window.__sameDocument") is True

    # Three ratings, keyboard only: a digit rates the current item, Enter submits, the next one is current.
    for n, score in enumerate(("4", "2", "5"), start=1):
        page.keyboard.press(score)
        page.keyboard.press("Enter")
        expect(page.locator("#queue .item.done")).to_have_count(n, timeout=BROWSER_WAIT_MS)
    assert page.locator("#queue .item.current").get_attribute("data-experience") == str(group_b[0])
    # feedback.saved, live: the compact line says it, and the counter of ratings moves.
    page.wait_for_selector("#live-line:has-text('feedback: rating by annotator')")
    page.wait_for_function("() => document.querySelector('#feedback-count').textContent === '3'")
    assert page.inner_text("#done-today") == "3"

    page.keyboard.press("?")
    assert page.locator("dialog#keys").is_visible()
    page.keyboard.press("Escape")
    assert not page.locator("dialog#keys").is_visible()

    # e edits the current item; Ctrl+Enter saves the correction.
    page.keyboard.press("e")
    page.wait_for_selector("#panel form.edit textarea:focus")
    page.fill("#panel form.edit textarea", "Corrected: 2 + 2 = 4")
    page.keyboard.press("Control+Enter")
    # (Under the whole suite's load on two cores this save once took over the default 15 s.)
    page.wait_for_selector("#panel .saved", timeout=BROWSER_WAIT_MS)
    # The corrected item looks different in the queue, in words too.
    corrected = page.locator(f'#queue .item.has-edit[data-experience="{group_b[0]}"]')
    expect(corrected.locator(".marks")).to_contain_text("corrected", timeout=BROWSER_WAIT_MS)

    # r ranks the current item's group: it starts unranked and cannot be saved until ordered;
    # a number puts the focused completion (A, then the next unranked) at that place.
    page.keyboard.press("r")
    page.wait_for_selector("#panel form.rank[data-complete='0']")
    assert page.locator("#panel ol.ranked .rank-item").count() == 0
    assert page.is_disabled("#panel .rank-save")
    page.keyboard.press("2")  # A (group_b[0]) second
    assert page.is_disabled("#panel .rank-save")
    page.keyboard.press("3")  # B (group_b[1]) third; C (group_b[2]) takes the place left, the best
    page.wait_for_selector("#panel form.rank[data-complete='1']")
    page.click("#panel form.rank button[type=submit]")
    page.wait_for_selector("#panel .saved")
    expect(page.locator("#queue .item.done")).to_have_count(6, timeout=BROWSER_WAIT_MS)

    a = {e.pk: e for e in Experience.objects.filter(pk__in=[e.pk for e in group_a])}
    ratings = {f.experience_id: f.value["score"] for f in Feedback.objects.filter(kind="rating", author=annotator)}
    assert ratings == {group_a[0].pk: 4, group_a[1].pk: 2, group_a[2].pk: 5}
    assert [a[e.pk].reward for e in group_a] == pytest.approx([0.5 * 1 + 0.5 * 0.75, 0.5 * 0 + 0.5 * 0.25, 0.5 * 1 + 0.5 * 1])
    assert {a[e.pk].status for e in group_a} == {"ready"}

    ranking = Feedback.objects.get(kind="ranking")
    assert ranking.value["order"] == [group_b[2], group_b[0], group_b[1]] and ranking.author == annotator
    b = {e.pk: e for e in Experience.objects.filter(pk__in=group_b)}
    # Borda: 1, 0.5, 0 for the order above, blended with autos 0, 1, 0.
    assert [b[pk].reward for pk in group_b] == pytest.approx([0.5 * 0 + 0.5 * 0.5, 0.5 * 1 + 0.5 * 0, 0.5 * 0 + 0.5 * 1])
    assert {e.status for e in b.values()} == {"ready"}

    expert = Experience.objects.get(is_expert=True)
    assert (expert.parent_id, expert.response_text, expert.prompt_text) == (group_b[0], "Corrected: 2 + 2 = 4", "What is 2 + 2?")
    assert Feedback.objects.get(kind="edit").value == {"expert_id": expert.pk}


def test_a_burst_of_events_arrives_in_batch_frames_and_each_is_shown_in_order(page: Any, live_url: str, owner: User,
                                                                             annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human"})
    add_member(run, annotator)
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(payload)))
    _open_annotate(page, live_url, run, "annotator")
    worker_write(run.pk, events=[{"type": "feedback.saved", "payload": {"kind": f"k{i}"}} for i in range(25)])
    page.locator("#live-feed li").nth(24).wait_for(state="attached")
    assert page.inner_text("#live-line").endswith("feedback: k24")  # the compact line: the latest
    notes = page.locator("#live-feed li").all_text_contents()  # folded away under "Live events"
    assert notes[:25] == [f"feedback: k{i}" for i in reversed(range(25))]  # newest first
    assert any('"type": "batch"' in f for f in frames)


XSS = (
    "Look: <script>window.__xss = 'script'</script>\n\n"
    "<img src=x onerror=\"window.__xss = 'img'\">\n\n"
    "[click me](javascript:window.__xss='link') and [raw](JAVASCRIPT:alert(1)) "
    "<a href=\"javascript:window.__xss='a'\">anchor</a> [ok](https://example.org/)\n\n"
    "```html\n<script>window.__xss = 'code'</script>\n```\n"
)


def test_a_hostile_completion_renders_inert_in_the_browser(page: Any, live_url: str, owner: User, annotator: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human"})
    add_member(run, annotator)
    _pending_group(run, "gx", [0.0, 0.0], texts=[XSS, "plain <b>bold?</b>"])
    _open_annotate(page, live_url, run, "annotator")
    # The live path too: an item that arrives over the websocket is appended by script.
    [live_id] = worker_write(run.pk, [{"key": "live-xss", "group_id": "gy", "status": "pending", "response_text": XSS,
                                       "prompt_text": "<img src=y onerror=\"window.__xss='prompt'\">"}])
    page.wait_for_selector(f'#queue .item[data-experience="{live_id}"]')
    page.keyboard.press("r")  # the ranking panel renders the completions once more
    page.wait_for_selector("#panel form.rank")
    # A control of our own after the completions: a broken image whose error handler (added by
    # the test, not by a completion) has run shows that a hostile one's would have run by now.
    page.evaluate("""() => new Promise((done) => {
        const img = document.createElement('img');
        img.addEventListener('error', () => { img.remove(); done(); });
        img.src = 'x-control';
        document.body.append(img);
    })""")

    assert page.evaluate("window.__xss") is None
    assert page.evaluate("document.querySelectorAll('#annotate img, #annotate script, #annotate [onerror]').length") == 0
    hrefs = page.eval_on_selector_all(".completion a", "els => els.map(e => e.getAttribute('href'))")
    assert hrefs and all(h.startswith(("http://", "https://", "mailto:")) for h in hrefs)
    assert page.locator(".completion", has_text="<script>window.__xss = 'script'</script>").count() >= 2
    page.get_by_text("[click me](javascript:window.__xss='link')").first.click()
    assert page.evaluate("window.__xss") is None


def _ws(live_url: str, run: Run, user: User | None) -> Any:
    headers = {"Origin": live_url}
    if user is not None:
        c = Client()
        c.force_login(user)
        headers["Cookie"] = f"sessionid={c.cookies['sessionid'].value}"
    return connect(live_url.replace("http", "ws") + f"/ws/runs/{run.pk}/", additional_headers=headers, open_timeout=EVENT_WAIT_S)


def test_an_annotator_cannot_subscribe_to_a_run_they_are_not_assigned_to(live_url: str, owner: User, annotator: User,
                                                                          outsider: User) -> None:
    mine = make_run(owner=owner, name="mine")
    add_member(mine, annotator)
    theirs = make_run(owner=owner, name="theirs")
    for user in (annotator, outsider, None):
        with pytest.raises(InvalidStatus) as refused:
            _ws(live_url, theirs, user)
        assert refused.value.response.status_code == 403
    with _ws(live_url, mine, annotator) as ws:
        ws.send(json.dumps({"type": "ping", "payload": 1}))
        assert json.loads(ws.recv(timeout=EVENT_WAIT_S)) == {"type": "pong", "payload": 1}
        worker_write(mine.pk, event={"type": "feedback.saved", "payload": {"id": 1}})
        assert json.loads(ws.recv(timeout=EVENT_WAIT_S)) == {"type": "feedback.saved", "payload": {"id": 1}}
