"""Issue 46, item 3, in a real browser: an annotator labels on the annotation page (keyboard),
an environment key and the owner act through the API, the trainer commits a step; each label
reaches its state (trained, taught the reward model, pending, unused: late, algorithm,
rejected, filtered, run ended), and the annotation page, the run page and the summary show
the counts derived again here from the rows (tests/figures/test_ledger.py's rows_ledger).
At 1280 px for the labelling, and the run page's ledger at 390 px too."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from apps.envapi.services import api_key_create
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.dashboard.test_pages_round2 import LAPTOP, PHONE, no_sideways_scroll, open_page, shot  # noqa: F401
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
from tests.figures.test_ledger import HELDOUT_SHARE, _train, counts, rm_publish, rows_ledger
from tests.servers import BROWSER_WAIT_MS

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STATES = ("trained", "reward_model", "pending", "unused")


def _shown(page: Any, box: str) -> dict[str, int]:
    return {state: int(page.inner_text(f"#{box} [data-ledger='{state}']")) for state in ("total", *STATES)}


def _expected(derived: dict[int, tuple[str, str]], ids: set[int] | None = None) -> dict[str, int]:
    c = counts(derived, ids)
    return {"total": sum(c.values()), **{s: c[s] for s in STATES}}


def _go(page: Any, pk: int) -> None:
    """Make experience `pk`'s item current with the keyboard (j / k), as a person would."""
    for _ in range(20):
        current = page.locator("#queue .item.current").get_attribute("data-experience")
        if current == str(pk):
            return
        order = page.locator("#queue .item:not(.done)").evaluate_all("els => els.map(e => e.dataset.experience)")
        page.keyboard.press("j" if current not in order or order.index(str(pk)) > order.index(current) else "k")
    raise AssertionError(f"item {pk} never became current")


def _rate(page: Any, pk: int, key: str, done: int) -> None:
    _go(page, pk)
    page.keyboard.press(key)
    page.keyboard.press("Enter")
    expect(page.locator("#queue .item.done")).to_have_count(done, timeout=BROWSER_WAIT_MS)


def test_each_label_state_through_the_browser_and_the_api(open_page: Any) -> None:
    owner, annie = make_user("owner"), make_user("annie")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="ledger in a browser",
                   # No holds: the test's trainer takes group a while annie's page is open
                   # (test_ledger.py covers the release of holds when a run ends).
                   feedback={"mode": "blend", "overlap": 1, "hold_seconds": 0},
                   reward_model={"enabled": True, "heldout_share": HELDOUT_SHARE})
    add_member(run, annie)
    run_transition(run=run, action="start", actor=owner)
    a, b, c, d = (make_experiences(run, groups=1, group_size=2, status="pending") for _ in range(4))
    _, env_key = api_key_create(name="env", runs=[run], actions=["feedback", "read"], created_by=owner)
    api = Client()
    api.defaults["HTTP_AUTHORIZATION"] = f"Bearer {env_key}"

    page = open_page(annie, LAPTOP)
    page.goto(f"/runs/{run.pk}/annotate/")
    expect(page.locator("#queue .item")).to_have_count(8)
    e = make_experiences(run, groups=1, group_size=2, status="pending")
    # Once annie's queue is handed out: an environment's A/B choice through the API, then a
    # reward-model version that trained on it (recorded as the trainer records it).
    r = api.post(f"/api/v1/runs/{run.pk}/feedback", {"kind": "pairwise", "experience_id": e[0].pk,
                                                     "other_experience_id": e[1].pk, "preferred": "a"},
                 content_type="application/json")
    assert r.status_code == 200, r.content
    # GRPO never trains on it, but the run's reward model has not read it yet: its next version will.
    assert (r.json()["state"]["state"], r.json()["state"]["reason"]) == ("pending", "reward_model_next")
    assert rm_publish(run).trained_on == [Feedback.objects.get(run=run, kind="pairwise").pk]

    _rate(page, a[0].pk, "4", 1)   # trained once group a trains
    _train(run, 1, a)              # the trainer's commit of step 1
    _rate(page, a[1].pk, "2", 2)   # after its group trained: late
    _rate(page, b[0].pk, "3", 3)   # its group waits for labels
    _go(page, b[1].pk)
    page.keyboard.press("e")       # a correction, which GRPO never trains
    page.wait_for_selector("#panel form.edit textarea:focus")
    page.fill("#panel form.edit textarea", "<answer>4</answer>")
    page.keyboard.press("Control+Enter")
    expect(page.locator("#panel .saved")).to_contain_text(
        "not trained by this run: grpo does not train on corrections: they count in an SFT or MIX run", timeout=30_000)
    _rate(page, c[0].pk, "5", 4)   # rejected by the owner through the API
    _rate(page, c[1].pk, "1", 5)   # its group waits
    _rate(page, d[0].pk, "4", 6)   # its group dropped by the owner through the API
    fb = {f.experience_id: f for f in Feedback.objects.filter(run=run, author=annie)}
    assert fb[a[1].pk].late and fb[a[0].pk].value["score"] == 4

    # The owner, through the API: reject c[0]'s rating, exclude group d.
    _, owner_key = api_key_create(name="owner", runs=[run], actions=["feedback", "read"], created_by=owner)
    owner_api = Client()
    owner_api.defaults["HTTP_AUTHORIZATION"] = f"Bearer {owner_key}"
    assert owner_api.post(f"/api/v1/runs/{run.pk}/review/labels/{fb[c[0].pk].pk}/reject").status_code == 200
    r = owner_api.post(f"/api/v1/runs/{run.pk}/experiences/bulk", {"action": "exclude", "ids": [x.pk for x in d]},
                       content_type="application/json")
    assert r.status_code == 200, r.content

    derived = rows_ledger(run)
    reasons = Counter(r for s, r in derived.values() if s == "unused")
    waiting = Counter(r for s, r in derived.values() if s == "pending")
    assert {s for s, _ in derived.values()} == set(STATES)
    # The late rating, the correction and the dropped group's rating: the policy will not train
    # on them, the reward model's next version reads them (unused only once the run ends unread).
    assert set(reasons) == {"rejected"} and waiting["reward_model_next"] == 3 and waiting["waiting"] >= 2
    # The API, each label: as the rows say.
    for pk, (state, reason) in derived.items():
        got = api.get(f"/api/v1/runs/{run.pk}/feedback/{pk}").json()["state"]
        assert (got["state"], got["reason"]) == (state, reason)

    # The annotation page: annie's own labels and the run's.
    page.reload()
    page.click("#annotate-ledger summary")  # folded away by default: the queue comes first
    mine = set(Feedback.objects.filter(run=run, author=annie).values_list("pk", flat=True))
    assert _shown(page, "ledger-mine") == _expected(derived, mine)
    assert _shown(page, "ledger-run") == _expected(derived)
    expect(page.locator("#ledger-mine [data-unused='rejected'] [data-n]")).to_have_text(str(reasons["rejected"]))
    expect(page.locator("#ledger-mine [data-pending='reward_model_next'] [data-n]")).to_have_text("3")
    shot(page, "ledger-annotate")

    # The run page, on a laptop and a phone: the run's and each person's.
    for size in (LAPTOP, PHONE):
        owner_page = open_page(owner, size)
        owner_page.goto(f"/runs/{run.pk}/")
        assert _shown(owner_page, "ledger-run") == _expected(derived)
        row = owner_page.locator("#ledger-people tr[data-person='annie']")
        assert int(row.locator("[data-ledger='trained']").inner_text()) == _expected(derived, mine)["trained"]
        no_sideways_scroll(owner_page)
        shot(owner_page, "ledger-run-page")

    # The owner stops the run in the browser: the labels of groups still waiting read
    # "unused: the run ended" on the summary.
    owner_page.goto(f"/runs/{run.pk}/control/stop/")
    owner_page.click(f"form[action='/runs/{run.pk}/control/stop/'] button[type=submit]")
    owner_page.wait_for_url(f"**/runs/{run.pk}/")
    run.refresh_from_db()
    assert run.status == "stopped"
    derived = rows_ledger(run)
    unused = Counter(r for s, r in derived.values() if s == "unused")
    ended = unused["run_ended"]
    assert ended >= 2 and not counts(derived)["pending"]
    # What no reward-model version read now says why the policy did not train on it.
    assert {r: unused[r] for r in ("late", "algorithm", "filtered", "rejected")} == {
        "late": 1, "algorithm": 1, "filtered": 1, "rejected": 1}
    owner_page.reload()
    assert _shown(owner_page, "ledger-summary") == _expected(derived)
    expect(owner_page.locator("#ledger-summary [data-unused='run_ended'] [data-n]")).to_have_text(str(ended))
    for reason in ("late", "algorithm", "filtered"):
        expect(owner_page.locator(f"#ledger-summary [data-unused='{reason}'] [data-n]")).to_have_text("1")
    no_sideways_scroll(owner_page)
    shot(owner_page, "ledger-summary")
    assert re.search(r"\d", owner_page.inner_text("#ledger-summary-people"))
