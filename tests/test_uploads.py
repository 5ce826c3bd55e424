"""Uploads have a cap per file (RFT_UPLOAD_MAX_BYTES), refused with 413 naming it before
anything is imported; and a run form that is refused leaves no taskset behind, its upload
included (issue #33)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from apps.buffer.models import Task, Taskset
from apps.runs.models import Run
from tests.dashboard.test_views import form_data

pytestmark = pytest.mark.django_db


def jsonl(n: int) -> bytes:
    return "".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "domain": "math"}) + "\n"
                   for i in range(n)).encode()


def test_a_taskset_over_the_cap_is_refused_with_413_naming_it_and_leaves_no_rows(owner: User, settings: Any) -> None:
    settings.RFT_UPLOAD_MAX_BYTES = 2000
    big = jsonl(200)
    assert len(big) > 2000
    client = Client()
    client.force_login(owner)
    refused = client.post("/runs/new/", {**form_data(), "taskset": SimpleUploadedFile("big.jsonl", big)})
    assert refused.status_code == 413
    text = refused.content.decode()
    assert "big.jsonl is larger than the upload limit of 2000 bytes (RFT_UPLOAD_MAX_BYTES)" in text
    assert text.startswith("taskset: ")  # the field it came in
    assert not Taskset.objects.exists() and not Task.objects.exists() and not Run.objects.exists()
    # Under the cap the same form creates the run with its tasks.
    settings.RFT_UPLOAD_MAX_BYTES = len(big)
    created = client.post("/runs/new/", {**form_data(), "taskset": SimpleUploadedFile("big.jsonl", big)})
    assert created.status_code == 302
    assert Task.objects.count() == 200


def test_a_refused_run_form_leaves_its_uploaded_taskset_behind_nowhere(owner: User) -> None:
    client = Client()
    client.force_login(owner)
    refused = client.post("/runs/new/", {**form_data(name="", **{"sampling.temperature": "-1"}),
                                         "taskset": SimpleUploadedFile("arith.jsonl", jsonl(5))})
    assert refused.status_code == 400
    html = refused.content.decode()
    assert "a run needs a name" in html
    assert "“arith.jsonl” (5 tasks) was read but not kept" in html and "choose the file again" in html
    assert not Taskset.objects.exists() and not Task.objects.exists() and not Run.objects.exists()
    assert "arith · 5 tasks" not in html  # the picker does not offer what is gone
