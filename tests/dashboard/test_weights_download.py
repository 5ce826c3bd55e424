"""The summary's weights download through a real `train` worker (issue 32, item 1): a member
asks for the best version's weights, the worker packs them (the run's export Dispatch row),
and the zip unzips into a model AutoModelForCausalLM loads with the version's weights. A
LoRA version comes merged into its base; a checkpoint that is gone says why, and a second
ask is sent again. The test side may import torch; the web side never does."""

from __future__ import annotations

import re
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from kernel.config import AdapterConfig
from apps.runs.models import Dispatch, ModelVersion, Run, TaskFailure
from apps.runs.services import run_transition
from tests.factories import add_member, make_run, make_taskset, make_user
from tests.servers import celery_worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def storage(tmp_path: Path, settings: Any) -> Path:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    return settings.RFT_STORAGE_DIR


@pytest.fixture
def train_worker(storage: Path, tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "train-worker.log"
    with celery_worker("train", name="export-train", log=log, includes=("workers.weights.download",),
                       RFT_STORAGE_DIR=str(storage)):
        yield log


def tiny(out: Path, seed: int) -> Path:
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(out, hidden_size=16, layers=1, heads=2, seed=seed)


def ended_run(owner: User, checkpoint: Path, *, base: Path | None = None) -> Run:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), model=str(base or checkpoint), name="ended")
    run_transition(run=run, action="start", actor=owner)
    ModelVersion.objects.create(run=run, number=1, checkpoint=str(checkpoint), train_step=1)
    Run.objects.filter(pk=run.pk).update(current_version=1)
    run.refresh_from_db()
    return run_transition(run=run, action="stop", actor=owner)


def summary_when(client: Client, run: Run, pattern: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    html = ""
    while time.monotonic() < deadline:
        html = client.get(f"/runs/{run.pk}/summary/", HTTP_HX_REQUEST="true").content.decode()
        if re.search(pattern, html):
            return html
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} never showed: {html[-2000:]}")


def test_an_annotator_downloads_the_best_version_and_it_loads_as_that_model(
        owner: User, tmp_path: Path, train_worker: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    version = tiny(tmp_path / "v1", seed=3)
    run = ended_run(owner, version)
    member = make_user("member")
    add_member(run, member)
    client = Client()
    client.force_login(member)
    # Asked twice (two clicks): one task, one zip.
    first = client.post(f"/runs/{run.pk}/weights/1/", HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'data-export="(preparing|ready)"', first)
    client.post(f"/runs/{run.pk}/weights/1/", HTTP_HX_REQUEST="true")
    html = summary_when(client, run, r'data-export="ready"')
    link = re.search(r'href="(/runs/\d+/weights/1\.zip)"', html)
    assert link, html
    response = client.get(link.group(1))
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert f'filename="run-{run.pk}-v1-weights.zip"' in response["Content-Disposition"]
    archive = tmp_path / "download.zip"
    archive.write_bytes(response.getvalue())
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp_path / "unzipped")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "unzipped", dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(version, dtype=torch.float32)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), original.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    export = Dispatch.objects.get(run=run, job=Dispatch.Job.EXPORT)
    assert export.sends == 1
    # The worker lets go of the run's export just after the zip is in place (the page may
    # offer the link first): under load that can take a moment, but it must happen.
    deadline = time.monotonic() + 30
    while export.state != Dispatch.State.IDLE and time.monotonic() < deadline:
        time.sleep(0.2)
        export.refresh_from_db()
    assert export.state == Dispatch.State.IDLE


def test_a_lora_version_downloads_merged_into_its_base(owner: User, tmp_path: Path, train_worker: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from workers.weights.adapters import adapter_wrap

    base = tiny(tmp_path / "base", seed=4)
    model = adapter_wrap(model=AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                         lora=AdapterConfig(rank=2, alpha=4.0, dropout=0.0, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)  # a trained adapter: not the identity
    adapter = tmp_path / "adapter-v1"
    model.save_pretrained(adapter)
    run = ended_run(owner, adapter, base=base)
    client = Client()
    client.force_login(owner)
    client.post(f"/runs/{run.pk}/weights/1/", HTTP_HX_REQUEST="true")
    summary_when(client, run, r'data-export="ready"')
    response = client.get(f"/runs/{run.pk}/weights/1.zip")
    (tmp_path / "lora.zip").write_bytes(response.getvalue())
    with zipfile.ZipFile(tmp_path / "lora.zip") as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / "merged")
    assert "adapter_config.json" not in names and "config.json" in names
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    expected = model.merge_and_unload()
    for (name, a), (_, b) in zip(merged.state_dict().items(), expected.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_a_checkpoint_that_is_gone_says_why_and_can_be_asked_again(owner: User, tmp_path: Path,
                                                                   train_worker: Path) -> None:
    version = tiny(tmp_path / "v1", seed=5)
    run = ended_run(owner, version)
    ModelVersion.objects.filter(run=run, number=1).update(checkpoint=str(tmp_path / "moved-away"))
    client = Client()
    client.force_login(owner)
    client.post(f"/runs/{run.pk}/weights/1/", HTTP_HX_REQUEST="true")
    html = summary_when(client, run, r'data-export="failed"')
    assert "Packing failed" in html and "moved-away" in html and "Try again" in html
    assert TaskFailure.objects.filter(run=run, task="export", step=1).count() == 1
    run.refresh_from_db()
    assert run.status == Run.Status.STOPPED and not run.error  # a side job's failure is not the run's
    # Put back where it was: asked again, it packs.
    ModelVersion.objects.filter(run=run, number=1).update(checkpoint=str(version))
    client.post(f"/runs/{run.pk}/weights/1/", HTTP_HX_REQUEST="true")
    summary_when(client, run, r'data-export="ready"')
    assert client.get(f"/runs/{run.pk}/weights/1.zip").status_code == 200


def test_a_zip_not_packed_yet_is_a_409_and_a_version_that_does_not_exist_a_404(owner: User, storage: Path) -> None:
    run = ended_run(owner, storage / "nowhere", base=Path("org/model"))
    client = Client()
    client.force_login(owner)
    response = client.get(f"/runs/{run.pk}/weights/1.zip")
    assert response.status_code == 409 and b"not packed yet" in response.content
    assert client.get(f"/runs/{run.pk}/weights/7.zip").status_code == 404
    assert client.post(f"/runs/{run.pk}/weights/7/").status_code == 404
    outsider = Client()
    outsider.force_login(make_user("outsider"))
    assert outsider.get(f"/runs/{run.pk}/weights/1.zip").status_code == 404


def test_a_version_that_is_not_the_best_downloads_from_the_running_runs_versions_panel(
        owner: User, tmp_path: Path, train_worker: Path) -> None:
    """Issue 64: any published version, not only the summary's best, and while the run goes on:
    the run page's Versions panel packs v1 (v2 is the best by accuracy) and links its zip,
    which holds v1's weights; a person who may not see the run gets a 404 for all of it."""
    import torch
    from transformers import AutoModelForCausalLM

    from apps.runs.metrics import metric_record

    v1, v2 = tiny(tmp_path / "v1", seed=6), tiny(tmp_path / "v2", seed=7)
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), model=str(v1), name="going on")
    run_transition(run=run, action="start", actor=owner)
    for number, path in ((1, v1), (2, v2)):
        ModelVersion.objects.create(run=run, number=number, checkpoint=str(path), train_step=2 * number)
        metric_record(run=run, step=2 * number, values={"eval/accuracy": 0.2 * number, "eval/tasks": 8.0,
                                                         "eval/version": float(number)})
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "best by accuracy (the domain&#x27;s verifier): v2" in page
    first = client.post(f"/runs/{run.pk}/weights/1/", {"panel": "versions"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'id="versions"' in first and re.search(r'data-of-version="1".*?data-weights="(preparing|ready)"', first, re.S)
    deadline, html = time.monotonic() + 180, ""
    while time.monotonic() < deadline and f'href="/runs/{run.pk}/weights/1.zip"' not in html:
        time.sleep(0.5)
        html = client.get(f"/runs/{run.pk}/versions/", HTTP_HX_REQUEST="true").content.decode()
    assert f'href="/runs/{run.pk}/weights/1.zip"' in html, html[-2000:]
    response = client.get(f"/runs/{run.pk}/weights/1.zip")
    assert response.status_code == 200
    (tmp_path / "v1.zip").write_bytes(response.getvalue())
    with zipfile.ZipFile(tmp_path / "v1.zip") as zf:
        zf.extractall(tmp_path / "v1-unzipped")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "v1-unzipped", dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(v1, dtype=torch.float32)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), original.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    outsider = Client()
    outsider.force_login(make_user("outsider"))
    assert outsider.get(f"/runs/{run.pk}/versions/").status_code == 404
    assert outsider.get(f"/runs/{run.pk}/weights/1.zip").status_code == 404
