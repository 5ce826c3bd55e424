"""In a real browser against a real server: people vote on a blind evaluation with the keyboard
at a phone's width (390 px: the answers stacked) and a laptop's (1280 px: side by side), and
nothing the page shows or exchanges (its HTML, every request's URL and body, every response of
the server's pages) says which version is which, names the run or a step."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.evaluation.models import Evaluation, Vote
from apps.evaluation.services import evaluation_create
from apps.runs.models import Run
from tests.evaluation.conftest import answer_all, publish
from tests.factories import add_member, make_run
from tests.servers import login

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RUN_NAME = "Zanzibar tutoring run"


def _leaks(text: str, evaluation: Evaluation) -> list[str]:
    patterns = [rf"\bv{e.number}\b" for e in evaluation.entrants.all()] + [
        rf"/runs/{evaluation.run_id}\b", rf"\brun[ _#-]?{evaluation.run_id}\b", r"\bstep\b", r"\bversions?\b",
        r"/nowhere/", re.escape(RUN_NAME), r"\bbaseline\b", r"\bentrant", r"\bis_check\b"]
    return [m for p in patterns for m in re.findall(p, text, flags=re.I)]


def _evaluation(owner: User, annotator: User) -> Evaluation:
    run = publish(make_run(owner=owner, name=RUN_NAME), 1, 2)
    add_member(run, annotator)
    return answer_all(evaluation_create(run=run, by=owner, prompts=["Say hello.", "Name a fruit.", "Add 2 and 3."],
                                        votes_per_pair=2, seed=4),
                      text=lambda run_id, version, prompt: f"{'Hello there' if version else 'hi'} — {prompt.lower()}")


@pytest.mark.parametrize(("width", "who"), [(390, "annotator"), (1280, "owner")])
def test_votes_by_keyboard_reveal_no_version(browser: Any, live_url: str, owner: User, annotator: User,
                                             width: int, who: str) -> None:
    evaluation = _evaluation(owner, annotator)
    person = {"annotator": annotator, "owner": owner}[who]
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    page = context.new_page()
    page.set_default_timeout(20_000)
    exchanged: list[str] = []

    def on_request(request: Any) -> None:
        exchanged.append(request.url + "\n" + (request.post_data or ""))

    def on_response(response: Any) -> None:
        # The server's pages and fragments (static files are the same for every evaluation).
        if "/static/" not in response.url and response.request.resource_type in ("document", "xhr", "fetch"):
            try:
                exchanged.append(response.url + "\n" + response.text())
            except Exception:  # a redirect has no body to read
                exchanged.append(response.url)

    try:
        login(page, live_url, who, next_path="/runs/")
        page.on("request", on_request)
        page.on("response", on_response)
        page.goto(f"/vote/{evaluation.token}/")
        total = evaluation.items.count()
        assert total == 4
        expect(page.locator("#vote .progress")).to_have_text(f"1 of {total}")
        a, b = page.locator("#vote .ab > section").all()
        box_a, box_b = a.bounding_box(), b.bounding_box()
        assert box_a is not None and box_b is not None
        if width < 700:  # stacked on a phone
            assert box_b["y"] >= box_a["y"] + box_a["height"] - 1
        else:  # side by side
            assert abs(box_a["y"] - box_b["y"]) < 2 and box_b["x"] > box_a["x"] + box_a["width"] - 1
        keys = ["a", "b", "t", "x"]
        for n, key in enumerate(keys, start=1):
            assert _leaks(page.content(), evaluation) == []
            if n == 1:
                page.keyboard.press("c")
                page.keyboard.type("A reads better")
                page.keyboard.press("Escape")
            page.keyboard.press(key)
            if n < total:
                expect(page.locator("#vote .progress")).to_have_text(f"{n + 1} of {total}")
        expect(page.locator("#vote .done")).to_contain_text(f"{total} of {total} done")
        votes = list(Vote.objects.filter(voter=person).order_by("created_at"))
        assert [v.choice for v in votes] == ["left", "right", "tie", "both_bad"]
        assert votes[0].comment == "A reads better"
        assert exchanged and all(_leaks(text, evaluation) == [] for text in exchanged), \
            [t[:200] for t in exchanged if _leaks(t, evaluation)]
    finally:
        context.close()
