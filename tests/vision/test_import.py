"""An image taskset imports from a zip (JSONL + pictures), a Parquet image column and a
datasets directory with an Image feature; each picture is stored once, by content, outside
Postgres; a non-image or an oversized picture is refused naming it, and nothing is written."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from apps.buffer.importers import ImportFailed, taskset_create, taskset_import
from apps.buffer.models import Task, Taskset, TasksetImage
from tests.factories import image_zip, picture_png

pytestmark = pytest.mark.django_db

QUESTION = "How many squares are in the image?"


def _stored(store: Path) -> list[Path]:
    return sorted(p for p in store.rglob("*") if p.is_file()) if store.exists() else []


def test_a_zip_of_jsonl_and_pictures_imports_each_picture_once_outside_postgres(tmp_path: Path, image_store: Path) -> None:
    one, two = picture_png(1), picture_png(2)
    records: list[dict[str, Any]] = [
        {"prompt": QUESTION, "answer": "1", "domain": "vision", "image": "a.png"},
        {"prompt": QUESTION, "answer": "2", "domain": "vision", "image": "pics/b.png"},
        # The same bytes under another name, and a task with two pictures.
        {"prompt": QUESTION, "answer": "1", "domain": "vision", "images": ["copy-of-a.png", "pics/b.png"]},
    ]
    taskset = taskset_import(name="squares", path=image_zip(tmp_path / "t.zip", records, {
        "a.png": one, "pics/b.png": two, "copy-of-a.png": one}))
    tasks = list(taskset.tasks.order_by("index"))
    a, b = hashlib.sha256(one).hexdigest(), hashlib.sha256(two).hexdigest()
    assert [t.images for t in tasks] == [[a], [b], [a, b]]
    # Two distinct pictures: two files in the store, two rows for the taskset.
    assert [p.name for p in _stored(image_store)] == sorted([a, b])
    assert (image_store / a[:2] / a).read_bytes() == one
    assert sorted(TasksetImage.objects.filter(taskset=taskset).values_list("sha256", "content_type", "width")) == sorted(
        [(a, "image/png", 32), (b, "image/png", 32)])
    # Postgres holds digests, never the bytes: the largest task row is small.
    with connection.cursor() as cur:
        cur.execute("SELECT max(octet_length(images::text) + octet_length(metadata::text)) FROM buffer_task WHERE taskset_id = %s",
                    [taskset.pk])
        assert cur.fetchone()[0] < 300
    # A second import of the same pictures writes no new file.
    taskset_import(name="again", path=image_zip(tmp_path / "u.zip", records[:1], {"a.png": one}))
    assert len(_stored(image_store)) == 2


def test_a_parquet_image_column_imports(tmp_path: Path, image_store: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pics = [picture_png(n) for n in (1, 2, 3)]
    table = pa.table({
        "question": [QUESTION] * 3,
        "answer": ["1", "2", "3"],
        "domain": ["vision"] * 3,
        # The Hugging Face Image encoding: a struct of bytes and path.
        "image": [{"bytes": p, "path": f"{i}.png"} for i, p in enumerate(pics)],
    })
    pq.write_table(table, tmp_path / "t.parquet")
    taskset = taskset_import(name="pq", path=tmp_path / "t.parquet")
    assert [t.images for t in taskset.tasks.order_by("index")] == [[hashlib.sha256(p).hexdigest()] for p in pics]
    assert [t.reference for t in taskset.tasks.order_by("index")] == ["1", "2", "3"]
    assert len(_stored(image_store)) == 3


def test_a_datasets_directory_with_an_image_feature_imports(tmp_path: Path, image_store: Path) -> None:
    import datasets
    from PIL import Image

    pics = [picture_png(n) for n in (1, 4)]
    ds = datasets.Dataset.from_dict(
        {"prompt": [QUESTION] * 2, "answer": ["1", "4"], "domain": ["vision"] * 2,
         "image": [Image.open(io.BytesIO(p)) for p in pics]},
        features=datasets.Features({"prompt": datasets.Value("string"), "answer": datasets.Value("string"),
                                    "domain": datasets.Value("string"), "image": datasets.Image()}),
    )
    ds.save_to_disk(str(tmp_path / "ds"))
    taskset = taskset_import(name="hf", path=tmp_path / "ds")
    tasks = list(taskset.tasks.order_by("index"))
    assert [len(t.images) for t in tasks] == [1, 1]
    # Re-encoded by datasets or not, what is stored is a picture of the same pixels.
    from apps.buffer.images import image_open

    for task, raw in zip(tasks, pics, strict=True):
        assert image_open(task.images[0]).tobytes() == Image.open(io.BytesIO(raw)).convert("RGB").tobytes()
    assert "image" not in tasks[0].metadata


def test_a_file_that_is_no_picture_is_refused_naming_it_and_nothing_is_written(tmp_path: Path, image_store: Path) -> None:
    records = [
        {"prompt": QUESTION, "answer": "1", "image": "a.png"},
        {"prompt": QUESTION, "answer": "2", "image": "notes-not-a-picture.png"},
    ]
    before = Taskset.objects.count()
    with pytest.raises(ImportFailed) as caught:
        taskset_import(name="bad", path=image_zip(tmp_path / "t.zip", records, {
            "a.png": picture_png(1), "notes-not-a-picture.png": b"#!/bin/sh\necho hello\n"}))
    assert "notes-not-a-picture.png" in str(caught.value) and "not an image" in str(caught.value)
    assert "line 2" in caught.value.field
    assert Taskset.objects.count() == before and not Task.objects.filter(taskset__name="bad").exists()


def test_an_svg_is_refused_since_browsers_run_its_script(tmp_path: Path) -> None:
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><rect width="5" height="5"/></svg>'
    with pytest.raises(ImportFailed, match="evil.svg"):
        taskset_import(name="svg", path=image_zip(tmp_path / "t.zip", [{"prompt": "q", "image": "evil.svg"}], {"evil.svg": svg}))


def test_an_oversized_picture_is_refused_naming_it(tmp_path: Path, settings: object) -> None:
    settings.RFT_IMAGE_MAX_BYTES = 200  # type: ignore[attr-defined]
    from PIL import Image

    buf = io.BytesIO()
    Image.effect_noise((64, 64), 60).convert("RGB").save(buf, format="PNG")
    with pytest.raises(ImportFailed) as caught:
        taskset_import(name="big", path=image_zip(tmp_path / "t.zip", [{"prompt": "q", "image": "huge-photo.png"}],
                                                 {"huge-photo.png": buf.getvalue()}))
    assert "huge-photo.png" in str(caught.value) and "RFT_IMAGE_MAX_BYTES" in str(caught.value)
    settings.RFT_IMAGE_MAX_BYTES = 10_000_000  # type: ignore[attr-defined]
    settings.RFT_IMAGE_MAX_PIXELS = 1000  # type: ignore[attr-defined]
    with pytest.raises(ImportFailed, match=r"huge-photo.png: the image is 64×64 pixels"):
        taskset_import(name="big", path=image_zip(tmp_path / "u.zip", [{"prompt": "q", "image": "huge-photo.png"}],
                                                 {"huge-photo.png": buf.getvalue()}))


def test_a_path_that_is_not_in_the_zip_or_a_plain_jsonl_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImportFailed, match="'missing.png' is not in the zip"):
        taskset_import(name="m", path=image_zip(tmp_path / "t.zip", [{"prompt": "q", "image": "missing.png"}], {}))
    (tmp_path / "plain.jsonl").write_text(json.dumps({"prompt": "q", "image": "/etc/passwd"}) + "\n")
    with pytest.raises(ImportFailed, match="put the JSONL and its pictures in one .zip"):
        taskset_import(name="p", path=tmp_path / "plain.jsonl")
    with pytest.raises(ImportFailed, match="put the JSONL and its pictures in one .zip"):
        taskset_create(name="r", records=[{"prompt": "q", "image": "a.png"}])
