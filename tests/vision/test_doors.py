"""An image taskset comes in by every door that takes a taskset file: the run form's upload
and `rft create --taskset`; a file that is no picture is refused by each, naming the file,
and nothing is left behind."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from apps.buffer.models import Taskset, TasksetImage
from apps.runs.models import Run
from tests.dashboard.test_views import field_block, form_data
from tests.factories import image_zip, picture_png

pytestmark = pytest.mark.django_db

Q = "How many squares are in the image?"


def _zip(tmp: Path, *, bad: bool = False) -> Path:
    records = [{"prompt": Q, "answer": "1", "domain": "vision", "image": "one.png"},
               {"prompt": Q, "answer": "2", "domain": "vision", "image": "two.png"}]
    files = {"one.png": picture_png(1), "two.png": b"not a picture at all" if bad else picture_png(2)}
    return image_zip(tmp / ("bad.zip" if bad else "squares.zip"), records, files)


def test_the_run_form_takes_a_zip_of_tasks_and_pictures(owner: User, tmp_path: Path) -> None:
    client = Client()
    client.force_login(owner)
    upload = SimpleUploadedFile("squares.zip", _zip(tmp_path).read_bytes())
    response = client.post("/runs/new/", {**form_data(), "taskset": upload})
    assert response.status_code == 302, response.content.decode()[:1500]
    run = Run.objects.get()
    assert run.taskset is not None
    assert [len(t.images) for t in run.taskset.tasks.order_by("index")] == [1, 1]
    assert TasksetImage.objects.filter(taskset=run.taskset).count() == 2

    bad = SimpleUploadedFile("bad.zip", _zip(tmp_path, bad=True).read_bytes())
    response = client.post("/runs/new/", {**form_data(name="second"), "taskset": bad})
    assert response.status_code == 400
    assert "two.png: not an image" in field_block(response.content.decode(), "taskset")
    assert Run.objects.count() == 1 and Taskset.objects.count() == 1


def test_the_cli_imports_a_zip_and_refuses_a_bad_picture_naming_it(owner: User, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: local/demo\nalgorithm: grpo\nrepeat_times: 4\nrewards: []\n")
    out = io.StringIO()
    call_command("rft", "create", str(config), "--name", "cli", "--owner", "owner", "--taskset", str(_zip(tmp_path)),
                 stdout=out, stderr=io.StringIO())
    run = Run.objects.get()
    assert run.taskset is not None
    assert run.taskset.tasks.filter(domain="vision").count() == 2 and all(t.images for t in run.taskset.tasks.all())
    with pytest.raises(CommandError, match="two.png: not an image"):
        call_command("rft", "create", str(config), "--name", "cli2", "--owner", "owner", "--taskset",
                     str(_zip(tmp_path, bad=True)), stdout=io.StringIO(), stderr=io.StringIO())
    assert Run.objects.count() == 1
