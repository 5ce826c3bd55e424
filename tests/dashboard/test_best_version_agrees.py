"""The run page, the summary and the API name the same best version in every case (issue #62
item 6): version 0 best, a later version best, ties (the earliest), and no evaluation at all
(then no page names an evaluated best, and the summary offers the last version published).
Each expectation is recomputed here from the metric rows."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.envapi.services import api_key_create
from apps.runs.metrics import metric_record
from apps.runs.models import ModelVersion, Run
from tests.factories import make_run

pytestmark = pytest.mark.django_db

# Per case: the held-out accuracy of versions 0, 1, 2 and 3 (at train steps 0, 2, 4, 6); None: no evaluation.
CASES = {
    "version 0 best": (0.6, 0.5, 0.55, 0.4),
    "a later version best": (0.3, 0.7, 0.5, 0.6),
    "a tie between later versions": (0.4, 0.7, 0.7, 0.2),
    "a tie with version 0": (0.7, 0.7, 0.1, 0.7),
    "no evaluation": None,
}


def expected_best(accuracies: tuple[float, ...] | None) -> int | None:
    """The evaluated version with the highest accuracy, the earliest on ties."""
    if accuracies is None:
        return None
    top = max(accuracies)
    return next(version for version, value in enumerate(accuracies) if value == top)


def ended_run(owner: User, accuracies: tuple[float, ...] | None) -> Run:
    run = make_run(owner=owner, name="ended")
    for number in range(4):
        ModelVersion.objects.create(run=run, number=number, checkpoint=f"/x/v{number}", train_step=2 * number)
        if accuracies is not None:
            metric_record(run=run, step=2 * number, values={"eval/accuracy": accuracies[number],
                                                            "eval/version": float(number)})
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, current_version=3, train_step=6)
    return Run.objects.get(pk=run.pk)


@pytest.mark.parametrize("case", list(CASES))
def test_the_run_page_the_summary_and_the_api_agree_on_the_best_version(case: str, owner: User) -> None:
    accuracies = CASES[case]
    run = ended_run(owner, accuracies)
    best = expected_best(accuracies)
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    summary = client.get(f"/runs/{run.pk}/summary/").content.decode()
    header = re.search(r'<span id="run-eval-best"( hidden)?>.*?id="run-best-version"[^>]*>v(\d*)<', page, re.S)
    offered = re.search(r'id="best-version" data-version="(\d+)"', summary)
    assert header and offered, (page, summary)
    _, raw = api_key_create(name="reader", runs=[run], actions=["read"], rate_limit_per_minute=100)
    api = Client().get(f"/api/v1/runs/{run.pk}/evaluation", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    if best is None:
        # No evaluation chose one: the header names none, the summary offers the last version and says why.
        assert header.group(1) == " hidden" and api["best_version"] is None
        assert offered.group(1) == "3" and "the last version published (no held-out evaluation chose one)" in summary
        return
    assert header.group(1) is None, "the run page names no best version"
    assert int(header.group(2)) == int(offered.group(1)) == api["best_version"] == best
    assert 'data-chosen-by="eval/accuracy"' in summary
    if best == 0:
        # The starting model: nothing to pack, the summary says what it is.
        assert "no trained version did better than the starting model" in summary
        assert 'id="weights-starting-model"' in summary and "weights-prepare" not in summary
    else:
        assert f"Prepare v{best} weights for download" in summary
