"""The run's exports over the environment API: a pipeline with a `read` key downloads what the
export page downloads, byte for byte, with the same filters and the same refusals (each naming
its field), so a team's scripts need no browser session.

Personas: Olga owns the run (the page); her training job holds the run's read key."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.feedback.training_data import EXPORT_FORMATS
from apps.envapi.services import api_key_create
from apps.feedback.kinds.pairwise import feedback_compare
from apps.runs.models import Run
from rftweb.api import api as ninja_api
from tests.factories import make_experiences, make_run, make_taskset

pytestmark = pytest.mark.django_db


def _job(run: Run) -> Client:
    _, raw = api_key_create(name="training job", runs=[run], actions=["read"], rate_limit_per_minute=1000)
    return Client(headers={"Authorization": f"Bearer {raw}"})


def _page(olga: User) -> Client:
    client = Client()
    client.force_login(olga)
    return client


def _body(response: object) -> bytes:
    return b"".join(response.streaming_content)  # type: ignore[attr-defined]


@pytest.fixture
def run(olga: User) -> Run:
    run = make_run(owner=olga, taskset=make_taskset(owner=olga))
    a, b, *_ = make_experiences(run, groups=2, group_size=3)
    feedback_compare(run=run, experience=a, other=b, winner="b", author=olga)  # a preference people made
    return run


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_the_api_gives_the_export_pages_bytes_for_every_format(olga: User, run: Run, fmt: str) -> None:
    api = _job(run).get(f"/api/v1/runs/{run.pk}/export/{fmt}.jsonl")
    page = _page(olga).get(f"/runs/{run.pk}/export/{fmt}.jsonl")
    assert api.status_code == page.status_code == 200
    assert api["Content-Type"].startswith("application/jsonl")
    assert f'filename="run-{run.pk}-{fmt}.jsonl"' in api["Content-Disposition"]
    body = _body(api)
    assert body == _body(page) and body  # every format has rows here: answers, pairs, tasks, the A/B choice
    rows = [json.loads(line) for line in body.decode().splitlines()]
    if fmt in ("dpo", "preferences"):
        assert all({"prompt", "chosen", "rejected"} <= set(row) for row in rows)


def test_the_filters_apply_alike_and_a_bad_one_is_a_422_naming_its_field(olga: User, run: Run) -> None:
    job, page = _job(run), _page(olga)
    every = _body(job.get(f"/api/v1/runs/{run.pk}/export/sft.jsonl")).decode().splitlines()
    best = _body(job.get(f"/api/v1/runs/{run.pk}/export/sft.jsonl", {"min_reward": "2"})).decode().splitlines()
    assert 0 < len(best) < len(every)
    assert "\n".join(best).encode() + b"\n" == _body(page.get(f"/runs/{run.pk}/export/sft.jsonl", {"min_reward": "2"}))
    assert _body(job.get(f"/api/v1/runs/{run.pk}/export/sft.jsonl", {"min_version": "99"})) == b""

    for params, field, words in (({"min_reward": "lots"}, "min_reward", "is not a number"),
                                 ({"min_margin": "inf"}, "min_margin", "not a finite number"),
                                 ({"min_version": "1.5"}, "min_version", "not a whole number"),
                                 ({"min_version": str(2**70)}, "min_version", "out of range")):
        refused = job.get(f"/api/v1/runs/{run.pk}/export/dpo.jsonl", params)
        assert refused.status_code == 422 and words in refused.json()["errors"][field]
        assert words in page.get(f"/runs/{run.pk}/export/dpo.jsonl", params).content.decode()
    unknown = job.get(f"/api/v1/runs/{run.pk}/export/parquet.jsonl")
    assert unknown.status_code == 422 and "use one of sft, dpo, grpo, preferences" in unknown.json()["errors"]["format"]


def test_the_export_is_named_by_its_format_and_the_old_links_still_work(olga: User, run: Run) -> None:
    """Round 64 renamed the export's `kind` its `format`: the schema's path parameter and a
    refusal's field say `format`; the path is positional, so every link made before is the same
    link and still downloads, on the API and on the page."""
    operation = ninja_api.get_openapi_schema()["paths"]["/api/v1/runs/{run_id}/export/{format}.jsonl"]["get"]
    assert [p["name"] for p in operation["parameters"] if p["in"] == "path"] == ["run_id", "format"]
    assert _job(run).get(f"/api/v1/runs/{run.pk}/export/sft.jsonl").status_code == 200
    assert _page(olga).get(f"/runs/{run.pk}/export/sft.jsonl").status_code == 200
    refused = _job(run).get(f"/api/v1/runs/{run.pk}/export/ppo.jsonl").json()
    assert refused["field"] == "format" and "unknown export format 'ppo'" in refused["errors"]["format"]


def test_a_key_of_another_run_or_none_gets_nothing(olga: User, run: Run) -> None:
    other = _job(make_run(owner=olga, name="other"))
    # 404, as for a missing run: a key cannot tell another run from none (issue #33).
    assert other.get(f"/api/v1/runs/{run.pk}/export/sft.jsonl").status_code == 404
    assert Client().get(f"/api/v1/runs/{run.pk}/export/sft.jsonl").status_code == 401
