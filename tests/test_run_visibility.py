"""A run a key or a person cannot see answers exactly as a missing run does (issue #33):
run ids cannot be enumerated. Every API route that names a run, asked by a key of another
run, gives the same status and the same body (the id aside) as for an id no run has; every
page that names a run gives an outsider the same 404 as a missing run."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from apps.runs.models import Run
from tests.envapi.conftest import make_key
from tests.factories import make_run, make_taskset, make_user
from tests.test_permissions import API, all_urls, rule_of

pytestmark = pytest.mark.django_db

OTHER_IDS = {"experience_id": 1, "group_id": "g", "key_id": 1, "member_id": 1, "assignment_id": 1, "format": "sft", "export_format": "sft",
             "name": "a-session", "version": 1, "sha256": "0" * 64, "action": "pause", "feedback_id": 1,
             "evaluation_id": 1}


def _ask(client: Client, url: str, **headers: str) -> Any:
    answer = client.get(url, headers=headers)
    if answer.status_code == 405:
        answer = client.post(url, data="{}", content_type="application/json", headers=headers)
    return answer


def _routes(rule: str | None) -> list[tuple[str, set[str]]]:
    found = []
    for key, route, pattern in all_urls():
        names = {a or b for a, b in re.findall(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>", route)}
        if pattern.name and "run_id" in names and (rule_of(key) == API) == (rule == API):
            found.append((key, names))
    return found


def test_every_api_route_answers_a_run_outside_the_key_as_a_missing_one() -> None:
    owner = make_user("owner")
    mine = make_run(owner=owner, taskset=make_taskset(owner=owner), name="mine")
    hidden = make_run(owner=make_user("stranger"), taskset=make_taskset(), name="hidden")
    missing = Run.objects.order_by("-pk").values_list("pk", flat=True)[0] + 1000
    _, raw = make_key(mine)
    client = Client()
    compared = not_found = 0
    for key, names in _routes(API):
        def url(run_id: int) -> str:
            return reverse(key, kwargs={n: run_id if n == "run_id" else OTHER_IDS[n] for n in names})

        seen = _ask(client, url(hidden.pk), Authorization=f"Bearer {raw}")
        absent = _ask(client, url(missing), Authorization=f"Bearer {raw}")
        where = f"{url(hidden.pk)}: {seen.status_code} vs {absent.status_code}"
        assert seen.status_code == absent.status_code and seen.status_code < 500, where
        assert seen.content.replace(str(hidden.pk).encode(), b"ID") == absent.content.replace(str(missing).encode(), b"ID"), where
        assert b"outsiders-never-see-this-run" not in seen.content
        compared += 1
        not_found += seen.status_code == 404
    # The rest refuse the body first (422), the same for both ids: nothing told apart.
    assert compared >= 10 and not_found >= 10, (compared, not_found)


def test_every_run_page_answers_an_outsider_as_a_missing_run() -> None:
    owner = make_user("owner")
    # A name no page's own markup holds (the site's 404 page has `hidden` attributes).
    hidden = make_run(owner=owner, taskset=make_taskset(owner=owner), name="outsiders-never-see-this-run")
    missing = hidden.pk + 1000
    client = Client()
    client.force_login(make_user("outsider"))
    checked = 0
    for key, names in _routes("page"):
        def url(run_id: int) -> str:
            return reverse(key, kwargs={n: run_id if n == "run_id" else OTHER_IDS.get(n, 1) for n in names})

        seen, absent = _ask(client, url(hidden.pk)), _ask(client, url(missing))
        assert seen.status_code == absent.status_code == 404, f"{url(hidden.pk)}: {seen.status_code} vs {absent.status_code}"
        assert b"outsiders-never-see-this-run" not in seen.content
        checked += 1
    assert checked >= 10
