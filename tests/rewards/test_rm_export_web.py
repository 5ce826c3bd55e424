"""A learned reward-model version leaves the run from the run page and the API too, not only
the CLI: the owner asks for it, a real `reward` worker packs the export (the directory
`rft reward-model` writes) into a zip, the panel turns "prepare" into a link, and the zip
loads with `AutoModelForSequenceClassification` and scores as the run's version does.

Personas: Olga owns the run; Anna annotates it; Oscar is an outsider."""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

torch = pytest.importorskip("torch")

from apps.envapi.services import api_key_create
from apps.rewards.pairs import PreferencePair
from apps.rewards.rm_download import export_zip_path
from apps.rewards.models import RewardModel
from apps.runs.models import Run
from tests.factories import add_member, make_run, make_user
from tests.servers import celery_worker
from workers.reward.likelihood import likelihood_model_fit

pytestmark = [pytest.mark.slow]

PROMPTS = ["What is 3 + 4?", "What is 6 + 2?"]
COMPLETIONS = ["<answer>7</answer>", "8 maybe"]


@pytest.fixture(scope="module")
def version_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    """A likelihood version (people preferred tagged right answers over bare wrong ones) and
    its own scores of PROMPTS / COMPLETIONS."""
    pairs = [PreferencePair(prompt=f"What is {a} + {b}?", chosen=f"<answer>{a + b}</answer>", rejected=f"{a + b + 3}",
                            chosen_id=2 * i, rejected_id=2 * i + 1, group_id=f"g{i}", kind="rating", margin=1.0)
             for i, (a, b) in enumerate((a, b) for a in range(2, 9) for b in range(1, 6))]
    out = tmp_path_factory.mktemp("storage") / "reward_models" / "v1-1"
    scorer, _ = likelihood_model_fit(base=str(demo_model_dir), train=pairs, heldout=[], out=out, max_length=64)
    return out, scorer.score(PROMPTS, COMPLETIONS)


@pytest.fixture(scope="module")
def reward_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    log = tmp_path_factory.mktemp("reward-worker") / "worker.log"
    with celery_worker("reward", name="rm-export", log=log, includes=("workers.reward.trainer",)):
        yield


def _run_with_version(olga: User, path: Path) -> tuple[Run, RewardModel]:
    run = make_run(owner=olga, reward_model={"enabled": True})
    rm = RewardModel.objects.create(run=run, version=1, path=str(path), base="demo", accuracy=0.9, pairs_heldout=20,
                                    scale=0.25, offset=0.5)
    export_zip_path(rm).unlink(missing_ok=True)
    return run, rm


def _panel(client: Client, run: Run) -> str:
    return client.get(f"/runs/{run.pk}/signal/reward-model/", HTTP_HX_REQUEST="true").content.decode()


def _wait_for(predicate: object, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise AssertionError("timed out")


def _scores_of_zip(blob: bytes, into: Path) -> tuple[list[float], dict[str, float]]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    zipfile.ZipFile(io.BytesIO(blob)).extractall(into)
    model = AutoModelForSequenceClassification.from_pretrained(into, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(into, trust_remote_code=True)
    scores = []
    for prompt, completion in zip(PROMPTS, COMPLETIONS, strict=True):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
                                            tokenize=True, return_dict=False)
        scores.append(float(model(input_ids=torch.tensor([list(ids)])).logits[0, 0]))
    return scores, model.config.calibration


@pytest.mark.django_db(transaction=True)
def test_the_owner_prepares_and_downloads_a_version_from_the_run_page(
    version_dir: tuple[Path, list[float]], reward_worker: None, tmp_path: Path,
) -> None:
    olga = make_user("olga")
    run, rm = _run_with_version(olga, version_dir[0])
    client = Client()
    client.force_login(olga)
    assert 'data-export="none"' in _panel(client, run)
    assert client.get(f"/runs/{run.pk}/signal/reward-model/v1/download/").status_code == 409  # not packed yet

    # The panel's button (hx-post); clicking twice asks the worker once.
    first = client.post(f"/runs/{run.pk}/signal/reward-model/v1/export/", HTTP_HX_REQUEST="true")
    assert first.status_code == 200 and 'data-export="preparing"' in first.content.decode()
    assert 'data-export="preparing"' in client.post(f"/runs/{run.pk}/signal/reward-model/v1/export/",
                                                    HTTP_HX_REQUEST="true").content.decode()
    _wait_for(lambda: 'data-export="ready"' in _panel(client, run))
    panel = _panel(client, run)
    assert f'href="/runs/{run.pk}/signal/reward-model/v1/download/"' in panel

    response = client.get(f"/runs/{run.pk}/signal/reward-model/v1/download/")
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert f'filename="run-{run.pk}-reward-model-v1.zip"' in response["Content-Disposition"]
    scores, calibration = _scores_of_zip(b"".join(response.streaming_content), tmp_path / "page")  # type: ignore[attr-defined]
    # The zip is the version itself: the same scores, the version's calibration, the people's order.
    assert scores == pytest.approx(version_dir[1], abs=1e-4)
    assert calibration == {"scale": 0.25, "offset": 0.5}
    assert scores[0] > scores[1]


@pytest.mark.django_db(transaction=True)
def test_an_environment_key_packs_and_fetches_a_version_over_the_api(
    version_dir: tuple[Path, list[float]], reward_worker: None, tmp_path: Path,
) -> None:
    run, rm = _run_with_version(make_user("olga"), version_dir[0])
    _, raw = api_key_create(name="env", runs=[run], actions=["read"], rate_limit_per_minute=1000)
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    base = f"/api/v1/runs/{run.pk}/reward-models/1/export"
    assert api.get(base).json()["state"] == "none"
    refused = api.get(base + ".zip")
    assert refused.status_code == 409 and "POST" in refused.json()["detail"]

    asked = api.post(base)
    assert asked.status_code == 202 and asked.json()["state"] == "preparing"
    _wait_for(lambda: api.get(base).json()["state"] == "ready")
    state = api.get(base).json()
    assert state["download"] == base + ".zip" and state["bytes"] == export_zip_path(rm).stat().st_size
    assert api.post(base).status_code == 200  # packed: nothing more to do
    blob = b"".join(api.get(state["download"]).streaming_content)  # type: ignore[attr-defined]
    scores, _ = _scores_of_zip(blob, tmp_path / "api")
    assert scores == pytest.approx(version_dir[1], abs=1e-4)


@pytest.mark.django_db(transaction=True)
def test_a_version_whose_files_are_gone_says_so_on_the_panel_and_can_be_tried_again(
    reward_worker: None, tmp_path: Path,
) -> None:
    olga = make_user("olga")
    run, rm = _run_with_version(olga, tmp_path / "deleted" / "v1-1")
    client = Client()
    client.force_login(olga)
    client.post(f"/runs/{run.pk}/signal/reward-model/v1/export/", HTTP_HX_REQUEST="true")
    _wait_for(lambda: 'data-export="failed"' in _panel(client, run))
    panel = _panel(client, run)
    assert "is not a saved reward model directory" in panel and ">try again</button>" in panel
    assert not export_zip_path(rm).exists()


@pytest.mark.django_db
def test_only_the_owner_may_pack_or_download_and_unknown_versions_are_404() -> None:
    olga, anna, oscar = make_user("olga"), make_user("anna"), make_user("oscar")
    run = make_run(owner=olga, reward_model={"enabled": True})
    add_member(run, anna)
    RewardModel.objects.create(run=run, version=1, path="/nowhere/v1", base="demo", accuracy=0.9)
    export, download = f"/runs/{run.pk}/signal/reward-model/v1/export/", f"/runs/{run.pk}/signal/reward-model/v1/download/"
    for user, status in ((anna, 403), (oscar, 404)):
        client = Client()
        client.force_login(user)
        assert client.post(export).status_code == status and client.get(download).status_code == status
        # The annotator sees the panel, without the owner's download column.
        if user is anna:
            assert "rm-export" not in _panel(client, run)
    client = Client()
    client.force_login(olga)
    assert client.post(f"/runs/{run.pk}/signal/reward-model/v7/export/").status_code == 404
    assert client.get(export).status_code == 405
    _, raw = api_key_create(name="env", runs=[run], actions=["read"], rate_limit_per_minute=1000)
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    missing = api.post(f"/api/v1/runs/{run.pk}/reward-models/7/export")
    assert missing.status_code == 404 and "no reward model version 7" in missing.json()["detail"]
    assert api.post(f"/api/v1/runs/{run.pk}/reward-models/0/export").status_code == 422


def _age_the_request(rm: RewardModel, minutes: float) -> None:
    """The request was made `minutes` ago and no worker has started on it (its message lost,
    or no reward worker running): the version's export row it left, moved back in time."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.rewards.rm_download import export_key
    from apps.runs.models import Dispatch

    asked = timezone.now() - timedelta(minutes=minutes)
    row, _ = Dispatch.objects.get_or_create(run_id=rm.run_id, job="rm_export", key=export_key(rm))
    Dispatch.objects.filter(pk=row.pk).update(state="sent", sent_at=asked, started_at=None,
                                              expires_at=asked + timedelta(minutes=31))


@pytest.mark.django_db
def test_a_request_no_worker_has_taken_says_queued_then_that_no_worker_came(tmp_path: Path) -> None:
    # No commit in this test, so the request's message is never sent: as with no reward worker.
    olga = make_user("olga")
    run, rm = _run_with_version(olga, tmp_path / "v1-1")
    client = Client()
    client.force_login(olga)
    panel = client.post(f"/runs/{run.pk}/signal/reward-model/v1/export/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-stage="queued"' in panel and "waiting for a reward worker" in panel and "packing" not in panel
    _, raw = api_key_create(name="env", runs=[run], actions=["read"], rate_limit_per_minute=1000)
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    base = f"/api/v1/runs/{run.pk}/reward-models/1/export"
    assert api.get(base).json() | {"bytes": 0} == {"version": 1, "state": "preparing", "stage": "queued", "bytes": 0,
                                                   "error": "", "download": None}

    _age_the_request(rm, minutes=4)  # a worker may be busy training the next version: still just queued
    assert 'data-stage="queued"' in _panel(client, run)
    _age_the_request(rm, minutes=12)
    panel = _panel(client, run)
    assert 'data-stage="stalled"' in panel and "no reward worker has taken it in 12 min" in panel
    assert ">ask again</button>" in panel
    assert api.get(base).json()["stage"] == "stalled"
    asked = api.post(base)
    assert asked.status_code == 202 and asked.json()["stage"] == "queued"  # sent again, the clock restarted


@pytest.mark.django_db(transaction=True)
def test_a_lost_request_asked_again_is_packed_by_the_worker(
    version_dir: tuple[Path, list[float]], reward_worker: None,
) -> None:
    olga = make_user("olga")
    run, rm = _run_with_version(olga, version_dir[0])
    client = Client()
    client.force_login(olga)
    _age_the_request(rm, minutes=15)  # asked a quarter of an hour ago; the broker lost the message
    assert ">ask again</button>" in _panel(client, run)
    again = client.post(f"/runs/{run.pk}/signal/reward-model/v1/export/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-export="preparing"' in again or 'data-export="ready"' in again
    _wait_for(lambda: 'data-export="ready"' in _panel(client, run))
    assert export_zip_path(rm).is_file()


@pytest.mark.django_db
def test_a_packing_whose_worker_crashed_shows_until_its_lease_ran_out_then_may_be_asked_again(tmp_path: Path) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.rewards.rm_download import export_begin, export_key
    from apps.runs.models import Dispatch

    olga = make_user("olga")
    run, rm = _run_with_version(olga, tmp_path / "v1-1")
    _, raw = api_key_create(name="env", runs=[run], actions=["read"], rate_limit_per_minute=1000)
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    base = f"/api/v1/runs/{run.pk}/reward-models/1/export"
    assert api.post(base).json()["stage"] == "queued"
    # A reward worker takes the message and starts packing, then its host dies; a second copy
    # of the message meanwhile packs nothing, nor does a second request send one.
    assert export_begin(rm=rm, task_id="first-copy") is not None
    assert export_begin(rm=rm, task_id="second-copy") is None
    assert api.post(base).json()["stage"] == "packing"
    assert api.get(base).json()["stage"] == "packing"
    Dispatch.objects.filter(run=run, job="rm_export", key=export_key(rm)).update(
        expires_at=timezone.now() - timedelta(seconds=1))  # half an hour later: its lease ran out
    assert api.get(base).json() | {"bytes": 0} == {"version": 1, "state": "none", "stage": "", "bytes": 0, "error": "",
                                                   "download": None}
    assert api.post(base).json()["stage"] == "queued"
