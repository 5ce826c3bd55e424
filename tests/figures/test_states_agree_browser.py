"""Issue 64 item 1, in a real browser: label states agree everywhere and move live.

An annotator labels through the annotation page with the keyboard (1280 px) while the owner
watches the run page. Every place that shows label states (the annotation header's ledger
line, the finished cards, "Your submissions" (in the page's box and on its own paged page), the
run page's "Where the labels went", later
the summary, the API and `rft figures`) shows the states derived again here from the rows
(tests/figures/test_ledger.py's rows_ledger), in the same order, summing to the total shown,
without a reload: after the labels, again after a train step consumed a group and a
reward-model version recorded what it learned from (the labels.changed event), and once the
run is stopped (run.status), when the annotator's "In queue" is 0 too. The annotation page
and the run page agree at 390 px as well.

Old code fails here: the header's line left "taught the reward model" out, the cards said
"done · rating 4/5" only, "Your submissions" had no state, and the run page's ledger never
moved after it was drawn (issue 64: "14 labels — 6 trained · 8 pending" for 8 minutes)."""

from __future__ import annotations

from collections import Counter
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from playwright.sync_api import expect

from apps.envapi.services import api_key_create
from apps.feedback.ledger import STATE_LINE
from apps.feedback.models import Feedback
from apps.feedback.reward_model.preferences import prompt_is_heldout
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.dashboard.test_pages_round2 import LAPTOP, PHONE, no_sideways_scroll, open_page, shot  # noqa: F401
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
from tests.figures.test_ledger import HELDOUT_SHARE, _train, rm_publish, rows_ledger
from tests.figures.test_ledger_browser import _rate
from tests.servers import BROWSER_WAIT_MS

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STATES = tuple(state for state, _ in STATE_LINE)


def _expected(run: Run, author: User | None = None) -> dict[str, int]:
    """The counts by state, from the rows alone (every state, zeros too, and the total)."""
    derived = rows_ledger(run)
    mine = None if author is None else set(Feedback.objects.filter(run=run, author=author).values_list("pk", flat=True))
    c = Counter(s for pk, (s, _) in derived.items() if mine is None or pk in mine)
    return {"total": sum(c.values()), **{s: c[s] for s in STATES}}


def _shows(page: Any, box: str, want: dict[str, int]) -> None:
    """The element `box` shows `want` (each state's count and the total), waiting for the live
    refresh to bring it there: no reload."""
    for key, n in want.items():
        expect(page.locator(f"{box} [data-ledger='{key}']").first).to_have_text(str(n), timeout=BROWSER_WAIT_MS)


def _in_order(page: Any, box: str) -> None:
    """The states appear in the one order (apps.feedback.ledger.STATE_LINE), all of them."""
    order = page.locator(f"{box} .ledger-state").evaluate_all("els => els.map(e => e.dataset.state)")
    assert tuple(order) == STATES, (box, order)


def _each_label_agrees(page: Any, run: Run, author: User, cards: bool = True) -> None:
    """The finished cards and "Your submissions" show each label's own state, as the rows say."""
    derived = rows_ledger(run)
    for fb in Feedback.objects.filter(run=run, author=author, kind="rating"):
        state = derived[fb.pk][0]
        expect(page.locator(f"#mine li[data-feedback='{fb.pk}'] .label-state")).to_have_attribute(
            "data-state", state, timeout=BROWSER_WAIT_MS)
        if cards:
            card = page.locator(f"#queue .item.done[data-experience='{fb.experience_id}'] .label-state")
            expect(card).to_have_attribute("data-state", state, timeout=BROWSER_WAIT_MS)


def _api_and_cli_agree(run: Run, api: Client, author: User) -> None:
    everyone, mine = _expected(run), _expected(run, author)
    body = api.get(f"/api/v1/runs/{run.pk}/labels").json()
    for got, want in ((body["run"], everyone), (body["people"][author.username], mine)):
        assert {k: got[k] for k in want} == want
        assert [s["state"] for s in got["states"]] == list(STATES)
        assert sum(s["count"] for s in got["states"]) == got["total"]
    out = StringIO()
    call_command("rft", "figures", str(run.pk), stdout=out)
    words = dict(STATE_LINE)
    for who, want in (("all labels", everyone), (author.username, mine)):
        line = ", ".join(f"{want[s]} {words[s]}" for s in STATES)
        assert f"{who}: {want['total']} labels: {line}" in out.getvalue(), out.getvalue()


def _everywhere(annie_page: Any, owner_page: Any, run: Run, annie: User, api: Client) -> None:
    """Every place agrees with the rows, within one live refresh of each page."""
    everyone, mine = _expected(run), _expected(run, annie)
    # The annotation header: the person's line (always shown), the box's ledgers and the
    # header's label count.
    _shows(annie_page, "#ledger-mine-line", mine)
    _in_order(annie_page, "#ledger-mine-line")
    _shows(annie_page, "#ledger-run", everyone)
    expect(annie_page.locator("#feedback-count")).to_have_text(str(everyone["total"]), timeout=BROWSER_WAIT_MS)
    _each_label_agrees(annie_page, run, annie)
    # The run page, the owner's, opened before (its ledger was empty then, and hidden; it
    # polls nothing: only the events bring it here): the run's and annie's row.
    expect(owner_page.locator("#run-ledger")).to_be_visible(timeout=BROWSER_WAIT_MS)
    _shows(owner_page, "#ledger-run", everyone)
    _in_order(owner_page, "#ledger-run")
    _shows(owner_page, "#ledger-people tr[data-person='annie']", mine)
    _api_and_cli_agree(run, api, annie)


def test_label_states_agree_everywhere_and_move_live(open_page: Any) -> None:
    owner, annie = make_user("owner"), make_user("annie")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="states agree",
                   # No holds: the test's trainer takes group a while annie's page is open.
                   feedback={"mode": "blend", "overlap": 1, "hold_seconds": 0},
                   reward_model={"enabled": True, "heldout_share": HELDOUT_SHARE})
    add_member(run, annie)
    run_transition(run=run, action="start", actor=owner)
    a, b, c, d = (make_experiences(run, groups=1, group_size=2, status="pending") for _ in range(4))
    # Group d's pair teaches the reward model: its prompt is not in the held-out share.
    assert not prompt_is_heldout(d[0].prompt_text, share=HELDOUT_SHARE, seed=run.cfg.seed)
    _, key = api_key_create(name="reader", runs=[run], actions=["read"], created_by=owner)
    api = Client()
    api.defaults["HTTP_AUTHORIZATION"] = f"Bearer {key}"

    owner_page = open_page(owner, LAPTOP)
    owner_page.goto(f"/runs/{run.pk}/")
    expect(owner_page.locator("#live")).to_have_attribute("data-state", "live")
    page = open_page(annie, LAPTOP)
    page.goto(f"/runs/{run.pk}/annotate/")
    expect(page.locator("#queue .item")).to_have_count(8)
    page.wait_for_selector("#annotate[data-live=open]")

    # Annie labels six items with the keyboard: group a and d whole, one of b and of c.
    for n, (e, key_) in enumerate(((a[0], "4"), (a[1], "2"), (b[0], "3"), (c[0], "5"), (d[0], "5"), (d[1], "1")), 1):
        _rate(page, e.pk, key_, n)
    assert _expected(run) == {"total": 6, "trained": 0, "reward_model": 0, "pending": 6, "unused": 0}
    _everywhere(page, owner_page, run, annie, api)
    shot(page, "states-agree-labelled")
    # "Your submissions" on its own page (the paged list), opened now: it follows too.
    mine_page = open_page(annie, LAPTOP)
    mine_page.goto(f"/runs/{run.pk}/annotate/mine/")
    mine_page.wait_for_selector("[data-mine-ws][data-live=open]")
    _each_label_agrees(mine_page, run, annie, cards=False)

    # The trainer consumes group a (step 1); the reward model's next version learns from the
    # rated pairs (a's and d's): a's labels are trained, d's taught the reward model. Nobody
    # reloads: the labels.changed events move every page.
    _train(run, 1, a)
    rm = rm_publish(run)
    assert {f.pk for f in Feedback.objects.filter(experience__in=d)} <= set(rm.trained_on)
    assert _expected(run) == {"total": 6, "trained": 2, "reward_model": 2, "pending": 2, "unused": 0}
    _everywhere(page, owner_page, run, annie, api)
    _each_label_agrees(mine_page, run, annie, cards=False)
    shot(page, "states-agree-trained")
    shot(owner_page, "states-agree-run-page")

    # On a phone: the annotation page and the run page show the same, nothing past the edge.
    for url, box in ((f"/runs/{run.pk}/annotate/", "#ledger-mine-line"), (f"/runs/{run.pk}/", "#ledger-run")):
        phone = open_page(annie if "annotate" in url else owner, PHONE)
        phone.goto(url)
        _shows(phone, box, _expected(run, annie if "annotate" in url else None))
        no_sideways_scroll(phone)
        shot(phone, "states-agree-phone")

    # The owner stops the run: b's and c's labels read "unused: the run ended" on the
    # annotation page (live) and the summary; nothing is in annie's queue any more.
    run_transition(run=run, action="stop", actor=owner)
    run.refresh_from_db()
    everyone, mine = _expected(run), _expected(run, annie)
    assert everyone == {"total": 6, "trained": 2, "reward_model": 2, "pending": 0, "unused": 2}
    _shows(page, "#ledger-mine-line", mine)
    _each_label_agrees(page, run, annie)
    expect(page.locator("#annotate-closed")).to_be_visible()
    expect(page.locator("#waiting-count")).to_have_count(0, timeout=BROWSER_WAIT_MS)
    expect(owner_page.locator("#summary[data-status='stopped']")).to_be_visible()
    _shows(owner_page, "#ledger-summary", everyone)
    _in_order(owner_page, "#ledger-summary")
    expect(owner_page.locator("#summary [data-figure='labels']")).to_contain_text(f"{everyone['total']}:")
    # The summary swapped in live holds the labels, the blind evaluations and the versions: the
    # running page's copies are gone (the walk saw two "Blind evaluations" on an ended run).
    expect(owner_page.locator("h3", has_text="Blind evaluations")).to_have_count(1, timeout=BROWSER_WAIT_MS)
    expect(owner_page.locator("#run-ledger")).to_have_count(0)
    assert owner_page.locator("#versions").count() <= 1
    expect(owner_page.locator("#labelling tr[data-person='annie'] .leased")).to_have_text("0", timeout=BROWSER_WAIT_MS)
    _api_and_cli_agree(run, api, annie)
    shot(owner_page, "states-agree-summary")
