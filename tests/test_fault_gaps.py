"""The single host's last fault gaps (issue 66 item 6) that need no server of their own: a
request about a run outside the key's scope is 404 on every API route whatever its body and
query (scope first, never a 422 that judged the input), and a refused page (403) is one log
line, not a traceback."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.runs.models import Run
from tests.envapi.conftest import make_key
from tests.factories import make_run, make_taskset

pytestmark = pytest.mark.django_db

METHODS = ("get", "post", "put", "patch", "delete")


def _run_routes() -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path template, operation) of every API route whose path names a run."""
    from rftweb.api import api

    schema = api.get_openapi_schema()
    return [(method, path, op) for path, ops in schema["paths"].items() if "{run_id}" in path
            for method, op in ops.items() if method in METHODS]


def _filled(path: str, op: dict[str, Any], run_id: int) -> str:
    """`path` with `run_id` and a valid-looking value for every other path parameter."""
    kinds = {p["name"]: p.get("schema", {}).get("type") for p in op.get("parameters", ()) if p.get("in") == "path"}
    return re.sub(r"\{(\w+)\}", lambda m: str(run_id) if m[1] == "run_id" else ("1" if kinds.get(m[1]) == "integer" else "g1"),
                  path)


def test_every_route_about_a_foreign_run_is_404_before_its_input_is_judged(owner: User, outsider: User) -> None:
    mine = make_run(owner=owner, taskset=make_taskset(owner=owner))
    foreign: Run = make_run(owner=outsider, taskset=make_taskset(owner=outsider))
    _, raw = make_key(mine)
    client = Client()
    headers = {"Authorization": f"Bearer {raw}"}
    routes = _run_routes()
    assert len(routes) > 20, routes  # the schema was read
    wrong: list[str] = []
    for method, path, op in routes:
        url = _filled(path, op, foreign.pk)
        # A body that no route takes (a list of one number), and no query at all (a required
        # query parameter missing): both were judged, 422, before the run was looked at.
        answer = client.generic(method.upper(), url, data="[1]", content_type="application/json", headers=headers)
        if answer.status_code != 404 or answer.json().get("code") != "not_found":
            wrong.append(f"{method.upper()} {url}: {answer.status_code} {answer.content[:200]!r}")
    assert not wrong, "\n".join(wrong)

    # The same bad body about the key's own run is judged: the check above was the scope's.
    resolve = next(path for _, path, _ in routes if path.endswith("/resolve"))
    judged = client.post(resolve.replace("{run_id}", str(mine.pk)).replace("{group_id}", "g1"), data="[1]",
                         content_type="application/json", headers=headers)
    assert judged.status_code == 422, judged.content


def test_a_refused_page_is_one_log_line_without_a_traceback(run: Run, annotator: User,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    client = Client()
    client.force_login(annotator)
    with caplog.at_level(logging.WARNING, logger="django.request"):
        refused = client.get(f"/runs/{run.pk}/keys/")  # the owner's page: the annotator is refused
    assert refused.status_code == 403
    lines = [r for r in caplog.records if r.name == "django.request"]
    assert len(lines) == 1 and "Forbidden" in lines[0].getMessage(), [r.getMessage() for r in lines]
    assert lines[0].exc_info is None and "Traceback" not in caplog.text
