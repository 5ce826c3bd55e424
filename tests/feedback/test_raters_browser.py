"""In a real browser against a real server and a real `reward` worker: as an annotator rates,
the owner's run page shows the reward model's held-out accuracy appear (trained by the worker
when enough labels came in), the owner downloads a version from the panel (packed by the
worker), and the Raters page counts the annotator's labels."""

from __future__ import annotations

import json
import random
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.rewards.models import RewardModel
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run
from tests.servers import BROWSER_WAIT_MS, login

pytest.importorskip("torch")
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def reward_worker(tmp_path: Path) -> Iterator[Path]:
    from tests.servers import celery_worker

    log = tmp_path / "reward.log"
    with celery_worker("reward", name="signal-reward", log=log, RFT_STORAGE_DIR=str(tmp_path / "storage"),
                       PYTHONPATH=str(ROOT)):
        yield log


def _groups(run: Run, n: int) -> list[Experience]:
    rng = random.Random(5)
    rows = []
    for g in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 9)
        for i, text in enumerate((f"<answer>{a + b}</answer>", f"{a + b} is it")):
            rows.append(experience_row(run, key=f"b{g}-{i}", group=f"bg{g}", status="pending", reward=None,
                                       auto_reward=0.0, prompt_text=f"What is {a} + {b}?", response_text=text))
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


def test_owner_watches_reward_model_accuracy_and_raters_update_as_an_annotator_rates(
    browser: Any, live_url: str, owner: User, annotator: User, demo_model_dir: Path, reward_worker: Path,
) -> None:
    run = make_run(owner=owner, feedback={"mode": "blend", "overlap": 1, "wait_seconds": 3600},
                   # likelihood: the test downloads a version's zip, and a `head` version has no
                   # transformers export yet (refused, naming the kind).
                   reward_model={"enabled": True, "kind": "likelihood", "base": str(demo_model_dir), "retrain_every": 8,
                                 "heldout_share": 0.5, "epochs": 2, "max_length": 64})
    add_member(run, annotator)
    _groups(run, 8)

    owner_ctx, annotator_ctx = browser.new_context(), browser.new_context()
    try:
        owner_page, ann_page = owner_ctx.new_page(), annotator_ctx.new_page()
        for p in (owner_page, ann_page):
            p.set_default_timeout(BROWSER_WAIT_MS)
        login(owner_page, live_url, "owner", next_path=f"/runs/{run.pk}/")
        owner_page.wait_for_selector("#reward-model")
        assert "no reward model yet" in owner_page.locator("#reward-model").inner_text()

        path = f"/runs/{run.pk}/annotate/"
        login(ann_page, live_url, "annotator", next_path=path)
        ann_page.wait_for_selector("#annotate[data-live=open]")
        # Keyboard rating in queue order: each group's tagged answer 5, its bare sibling 1.
        for n in range(1, 9):
            ann_page.keyboard.press("5" if n % 2 else "1")
            ann_page.keyboard.press("Enter")
            expect(ann_page.locator("#queue .item.done")).to_have_count(n, timeout=BROWSER_WAIT_MS)  # as the pages

        # The eighth label makes a version due: the reward worker trains it, the panel polls.
        # (Locator waits, not page-side script: the CSP forbids evaluating strings.)
        expect(owner_page.locator("[data-figure=rm-version]")).to_have_text("v1", timeout=240_000)
        accuracy = owner_page.locator("[data-figure=rm-accuracy]").inner_text().strip()
        rm = RewardModel.objects.get(run=run, version=1)
        assert rm.labels == 8 and rm.accuracy is not None
        assert accuracy == f"{rm.accuracy:.3f}"
        assert owner_page.locator("[data-figure=labels]").first.inner_text().strip() == "8"

        # Eight more labels: the run page moves on to v2 and shows v2's accuracy, unreloaded.
        ann_page.goto(live_url + path)
        ann_page.wait_for_selector("#annotate[data-live=open]")
        for n in range(1, 9):
            ann_page.keyboard.press("5" if n % 2 else "1")
            ann_page.keyboard.press("Enter")
            expect(ann_page.locator("#queue .item.done")).to_have_count(n, timeout=BROWSER_WAIT_MS)  # as the pages
        expect(owner_page.locator("[data-figure=rm-version]")).to_have_text("v2", timeout=240_000)
        v2 = RewardModel.objects.get(run=run, version=2)
        assert v2.labels == 16 and v2.accuracy is not None
        expect(owner_page.locator("[data-figure=rm-accuracy]")).to_have_text(f"{v2.accuracy:.3f}")
        expect(owner_page.locator("[data-figure=labels]").first).to_have_text("16")

        # The owner takes v2 away from the page: the worker packs it, the panel links the zip.
        owner_page.locator('tr[data-version="2"] button', has_text="prepare .zip").click()
        link = owner_page.locator('tr[data-version="2"] .rm-export a')
        expect(link).to_have_text("v2.zip", timeout=120_000)
        with owner_page.expect_download() as download:
            link.click()
        assert download.value.suggested_filename == f"run-{run.pk}-reward-model-v2.zip"
        with zipfile.ZipFile(download.value.path()) as archive:
            config = json.loads(archive.read("config.json"))
        assert config["calibration"] == pytest.approx({"scale": v2.scale, "offset": v2.offset})

        owner_page.click("nav.subnav >> text=Raters")
        owner_page.wait_for_selector("#raters")
        row = owner_page.locator('#raters tr[data-rater="annotator"]')
        assert row.locator("[data-figure=labels]").inner_text().strip() == "16"
    finally:
        owner_ctx.close()
        annotator_ctx.close()
