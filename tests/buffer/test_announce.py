"""`experience.created` has one payload, whoever wrote the experience: built by
experience_write from the ExperienceDraft it stored, published once the write commits."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from apps.buffer.models import Experience
from apps.feedback.kinds.edit import feedback_edit
from apps.runs.models import Run
from tests.conftest import run_socket_connect
from tests.envapi.conftest import Api, make_key
from tests.factories import add_member, make_experiences, make_run, make_user

PAYLOAD_KEYS = {"id", "group_id", "task_id", "source", "status", "reward", "reward_parts", "model_version",
                "finish_reason", "prompt", "response"}


async def _created(comm: Any, *, quiet: float) -> list[dict[str, Any]]:
    """Every experience.created until the stream has been quiet for `quiet` seconds."""
    seen: list[dict[str, Any]] = []
    while not await comm.receive_nothing(timeout=quiet, interval=0.05):
        frame = await comm.receive_json_from(timeout=1)
        frames = frame["events"] if frame["type"] == "batch" else [frame]
        seen.extend(f["payload"] for f in frames if f["type"] == "experience.created")
    return seen


def _setup() -> tuple[Run, Any, Experience]:
    owner = make_user("owner")
    run = make_run(owner=owner, feedback={"mode": "blend"})
    annotator = make_user("annotator")
    add_member(run, annotator)
    [original] = make_experiences(run, groups=1, group_size=1)
    return run, annotator, original


@pytest.mark.django_db(transaction=True)
async def test_an_environment_and_a_person_announce_experiences_in_one_shape() -> None:
    run, annotator, original = await sync_to_async(_setup)()
    comm, connected = await run_socket_connect(run, annotator)
    assert connected
    try:
        def write() -> None:
            api = Api(make_key(run)[1])
            response = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [
                {"key": "t1", "prompt": "2 + 2?", "response": "4", "reward": 1.0},
                {"key": "t2", "prompt": "2 + 2?", "response": "5"},
            ]})
            assert response.status_code == 200, response.content
            again = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [
                {"key": "t1", "prompt": "2 + 2?", "response": "4", "reward": 1.0}]})
            assert again.json()["duplicates"] == 1  # a duplicate is not announced again
            feedback_edit(run=run, author=annotator, experience=original, text="The answer is 4.")

        await sync_to_async(write)()
        payloads = await _created(comm, quiet=3)
    finally:
        await comm.disconnect()

    assert all(set(p) == PAYLOAD_KEYS for p in payloads)
    stored = {e.pk: e async for e in Experience.objects.filter(pk__in=[p["id"] for p in payloads])}
    for p in payloads:
        e = stored[p["id"]]
        assert (p["group_id"], p["source"], p["status"], p["reward"], p["response"]) == (
            e.group_id, e.source, e.status, e.reward, e.response_text)
    assert [(p["source"], p["status"]) for p in payloads] == [("env", "pending"), ("env", "pending"),
                                                             ("human", "ready")]
