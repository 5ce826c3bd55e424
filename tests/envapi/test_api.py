"""Every endpoint of /api/v1/, its success and its error paths, on Postgres."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience, Task, TaskAttempt
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.runs.services import model_version_publish
from tests.envapi.conftest import Api, make_key
from tests.factories import first_task, make_experiences, make_run, make_taskset, taskset_of

pytestmark = pytest.mark.django_db


def traj(key: str = "ep-1", **fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"key": key, "prompt": "What is 2 + 2?", "response": "<answer>4</answer>",
                            "token_ids": [5, 6, 7, 8, 9], "prompt_length": 3, "logprobs": [-0.1, -0.2],
                            "reward": 1.0, "reward_parts": {"correct": 1.0}}
    item.update(fields)
    return item


# ---- runs ----------------------------------------------------------------------------


def test_it_lists_only_the_runs_the_key_is_scoped_to(api: Api, run: Run, owner: User) -> None:
    make_run(owner=owner, name="someone else's")
    response = api.get("/runs")
    assert response.status_code == 200
    assert [r["id"] for r in response.json()] == [run.pk]


def test_a_run_shows_its_config_and_the_starting_model_as_version_zero(api: Api, run: Run) -> None:
    body = api.get(f"/runs/{run.pk}").json()
    assert body["config"]["repeat_times"] == 4 and body["config"]["algorithm"] == "grpo"
    assert body["current_version"] == {"number": 0, "checkpoint": "local/demo", "train_step": 0, "created_at": None}


def test_a_run_shows_its_current_published_version_and_checkpoint(api: Api, run: Run) -> None:
    model_version_publish(run=run, number=3, checkpoint="/ckpt/runs/1/v3", train_step=30)
    version = api.get(f"/runs/{run.pk}").json()["current_version"]
    assert (version["number"], version["checkpoint"], version["train_step"]) == (3, "/ckpt/runs/1/v3", 30)


def test_an_unknown_run_is_404(api: Api) -> None:
    response = api.get("/runs/987654")
    assert response.status_code == 404 and "987654" in response.json()["detail"]


def test_a_run_outside_the_keys_runs_answers_exactly_like_a_missing_run(owner: User, run: Run) -> None:
    """Issue #33: every router's run access (apps.runs.api_kit.run_reachable) answers 404 for
    a run the key is not scoped to, with the words of a missing run, so run ids cannot be
    enumerated; nothing is written to the other run."""
    other = make_run(owner=owner, name="not this key's", taskset=make_taskset(owner=owner))
    [exp] = Experience.objects.bulk_create([Experience(run=other, key="o1", group_id="g")])
    missing = other.pk + 10_000
    api = Api(make_key(run)[1])
    calls: list[tuple[str, str, Any]] = [
        ("get", "/runs/{id}", None),
        ("post", "/runs/{id}/tasks/claim", {"worker": "w", "size": 1}),
        ("post", "/runs/{id}/tasks/release", {"worker": "w", "attempt_ids": [1]}),
        ("post", "/runs/{id}/tasks/finish", {"worker": "w", "attempt_ids": [1]}),
        ("post", "/runs/{id}/tasks", {"tasks": [{"prompt": "x"}]}),
        ("post", "/runs/{id}/trajectories", {"trajectories": [traj("sneak")]}),
        ("post", "/runs/{id}/feedback", {"experience_id": exp.pk, "kind": "rating", "score": 5}),
        ("get", "/runs/{id}/export/sft.jsonl", None),
        ("get", "/runs/{id}/events", None),
        ("post", "/runs/{id}/sessions/s1/finish", {"reward": 1.0}),
        ("get", "/runs/{id}/raters", None),
        ("get", "/runs/{id}/reward-models", None),
        ("get", "/runs/{id}/k12-graders", None),
        ("post", "/runs/{id}/reward-models/1/export", None),
    ]
    for method, path, body in calls:
        answers = []
        for run_id in (other.pk, missing):
            url = path.format(id=run_id)
            response = api.get(url) if method == "get" else api.post(url, body)
            answers.append((response.status_code, response.json()["detail"].replace(str(run_id), "<id>")))
        assert answers[0] == answers[1] == (404, "run <id> not found"), (method, path, answers)
    assert list(Experience.objects.filter(run=other).values_list("key", flat=True)) == ["o1"]
    assert not Feedback.objects.filter(run=other).exists() and not TaskAttempt.objects.filter(run=other).exists()
    assert taskset_of(other).tasks.count() == 4


def test_a_run_id_out_of_range_is_422_not_a_crash(api: Api) -> None:
    response = api.get(f"/runs/{2**70}")
    assert response.status_code == 422 and "run_id" in response.json()["errors"]


# ---- tasks ---------------------------------------------------------------------------


def test_it_leases_a_batch_of_tasks_to_the_key(api: Api, run: Run, key: Any) -> None:
    body = api.post(f"/runs/{run.pk}/tasks/claim", {"size": 3, "worker": "env-1"}).json()
    assert len(body["tasks"]) == 3 and body["worker"] == "env-1" and body["lease_expires_at"]
    first = body["tasks"][0]
    assert first["prompt"].startswith("What is") and first["reference"] is not None and first["domain"] == "math"
    leased = TaskAttempt.objects.filter(run=run, status="leased")
    assert leased.count() == 3 and set(leased.values_list("lease_owner", flat=True)) == {f"key:{key[0].prefix}:env-1"}


def test_released_tasks_go_back_to_the_queue(api: Api, run: Run) -> None:
    ids = [t["attempt_id"] for t in api.post(f"/runs/{run.pk}/tasks/claim", {"size": 2}).json()["tasks"]]
    assert api.post(f"/runs/{run.pk}/tasks/release", {"attempt_ids": ids[:1]}).json() == {"count": 1}
    assert TaskAttempt.objects.get(pk=ids[0]).status == "queued"
    assert TaskAttempt.objects.get(pk=ids[1]).status == "leased"


def test_another_workers_lease_is_not_released(api: Api, run: Run) -> None:
    ids = [t["attempt_id"] for t in api.post(f"/runs/{run.pk}/tasks/claim", {"size": 2, "worker": "a"}).json()["tasks"]]
    assert api.post(f"/runs/{run.pk}/tasks/release", {"attempt_ids": ids, "worker": "b"}).json() == {"count": 0}


def test_finished_tasks_record_the_version(api: Api, run: Run) -> None:
    ids = [t["attempt_id"] for t in api.post(f"/runs/{run.pk}/tasks/claim", {"size": 1}).json()["tasks"]]
    assert api.post(f"/runs/{run.pk}/tasks/finish", {"attempt_ids": ids, "model_version": 2}).json() == {"count": 1}
    attempt = TaskAttempt.objects.get(pk=ids[0])
    assert attempt.status == "done" and attempt.model_version == 2


def test_added_tasks_extend_the_taskset_and_can_be_claimed_at_once(api: Api, run: Run) -> None:
    api.post(f"/runs/{run.pk}/tasks/claim", {"size": 4})  # epoch 0 queued and used up
    response = api.post(f"/runs/{run.pk}/tasks", {"tasks": [
        {"prompt": "Guess my number", "reference": 7, "domain": "game", "metadata": {"low": 1}},
        {"messages": [{"role": "user", "content": "hi"}]},
    ]})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["taskset_id"] == run.taskset_id
    assert list(Task.objects.filter(pk__in=body["task_ids"]).order_by("index").values_list("index", flat=True)) == [4, 5]
    claimed = api.post(f"/runs/{run.pk}/tasks/claim", {"size": 8}).json()["tasks"]
    assert sorted(t["task_id"] for t in claimed) == sorted(body["task_ids"])


def test_a_run_without_a_taskset_gets_one_when_tasks_are_added(owner: User) -> None:
    run = make_run(owner=owner)
    api = Api(make_key(run)[1])
    body = api.post(f"/runs/{run.pk}/tasks", {"tasks": [{"prompt": "p"}]}).json()
    run.refresh_from_db()
    assert run.taskset_id == body["taskset_id"] and taskset_of(run).tasks.count() == 1


def test_a_bad_task_rejects_the_whole_batch_naming_it(api: Api, run: Run) -> None:
    before = Task.objects.count()
    response = api.post(f"/runs/{run.pk}/tasks", {"tasks": [{"prompt": "fine"}, {"reference": 3}]})
    assert response.status_code == 422
    assert "tasks.1" in response.json()["errors"]
    assert Task.objects.count() == before


def test_claiming_from_a_run_without_tasks_gives_an_empty_batch(owner: User) -> None:
    run = make_run(owner=owner)
    body = Api(make_key(run)[1]).post(f"/runs/{run.pk}/tasks/claim", {"size": 2}).json()
    assert body["tasks"] == [] and body["lease_expires_at"] is None


# ---- trajectories --------------------------------------------------------------------


def test_a_trajectory_becomes_an_experience_with_its_reward(api: Api, run: Run) -> None:
    task = first_task(run)
    response = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj(task_id=task.pk, group_id="g1")]})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["created"] == 1 and body["results"][0]["duplicate"] is False
    exp = Experience.objects.get(pk=body["results"][0]["id"])
    assert (exp.source, exp.status, exp.reward, exp.auto_reward) == ("env", "ready", 1.0, 1.0)
    assert exp.token_ids == [5, 6, 7, 8, 9] and exp.prompt_length == 3 and exp.logprobs == [-0.1, -0.2]
    assert exp.reward_parts == {"correct": 1.0} and exp.group_id == "env:g1" and exp.task_id == task.pk
    assert exp.model_version == run.current_version and exp.key == "env:ep-1"


def test_a_multi_turn_trajectory_keeps_its_messages_and_tool_calls(api: Api, run: Run) -> None:
    messages = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "assistant", "content": "It rains in Oslo."},
    ]
    body = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [
        {"key": "mt-1", "messages": messages, "reward": 0.5, "model_version": 2}]}).json()
    exp = Experience.objects.get(pk=body["results"][0]["id"])
    assert exp.messages is not None
    assert exp.messages[1]["tool_calls"][0]["function"]["name"] == "weather"
    assert exp.messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "rain"}
    assert exp.response_text == "It rains in Oslo." and exp.model_version == 2 and exp.token_ids == []


def test_submitting_the_same_key_twice_stores_it_once(api: Api, run: Run) -> None:
    first = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj("same")]}).json()
    again = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj("same", reward=0.0), traj("other")]}).json()
    assert (again["created"], again["duplicates"]) == (1, 1)
    assert again["results"][0] == {"key": "same", "id": first["results"][0]["id"], "duplicate": True}
    assert Experience.objects.get(run=run, key="env:same").reward == 1.0
    assert Experience.objects.filter(run=run).count() == 2


def test_an_environment_cannot_take_an_explorers_key_or_join_its_group(api: Api, run: Run) -> None:
    [explored] = make_experiences(run, groups=1, group_size=1)
    Experience.objects.filter(pk=explored.pk).update(key="explore:7:0", group_id="attempt-7")
    body = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [
        traj("explore:7:0", group_id="attempt-7"), traj("x" * 200)]}).json()
    assert body["created"] == 2 and [r["key"] for r in body["results"]] == ["explore:7:0", "x" * 200]
    env = Experience.objects.get(pk=body["results"][0]["id"])
    assert env.pk != explored.pk and (env.key, env.group_id) == ("env:explore:7:0", "env:attempt-7")
    assert Experience.objects.filter(run=run, group_id="attempt-7").count() == 1
    long = Experience.objects.get(pk=body["results"][1]["id"])
    assert long.key.startswith("env:sha256:") and len(long.group_id) <= 100
    again = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj("x" * 200)]}).json()
    assert again["results"][0] == {"key": "x" * 200, "id": long.pk, "duplicate": True}


def test_a_trajectory_without_a_reward_waits_for_one(api: Api, run: Run) -> None:
    body = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj(reward=None)]}).json()
    exp = Experience.objects.get(pk=body["results"][0]["id"])
    assert exp.status == "pending" and exp.reward is None


@pytest.mark.parametrize(
    ("item", "field", "words"),
    [
        (traj(logprobs=[-0.1]), "trajectories.0", "logprobs has 1 entries for 2 response tokens"),
        (traj(prompt_length=9), "trajectories.0", "prompt_length 9"),
        (traj(bogus=1), "trajectories.0.bogus", "Extra inputs"),
        (traj(key=""), "trajectories.0.key", "at least 1"),
        (traj(token_ids=[1, -4, 3, 3, 3]), "trajectories.0.token_ids.1", "greater than or equal"),
        (traj(messages=[{"role": "robot", "content": "x"}]), "trajectories.0.messages.0.role", "system"),
        (traj(reward_parts={"x": "high"}), "trajectories.0.reward_parts.x", "number"),
    ],
)
def test_a_malformed_trajectory_is_422_naming_the_field(api: Api, run: Run, item: dict[str, Any], field: str, words: str) -> None:
    response = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj("good"), item]})
    assert response.status_code == 422
    errors = response.json()["errors"]
    field = field.replace("trajectories.0", "trajectories.1")
    assert field in errors and words in errors[field], errors
    assert not Experience.objects.filter(run=run).exists()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"trajectories": [{"key": "k", "prompt": "p", "response": "r", "reward": NaN}]}', "body"),
        (b'{"trajectories": [{"key": "k", "prompt": "p", "response": "r", "reward": 1e999}]}', "trajectories.0.reward"),
        (b'{"trajectories": [{"key": "k\\u0000", "prompt": "p", "response": "r"}]}', "trajectories.0.key"),
        (b'{"trajectories": [{"key": "k", "prompt": "\\ud800", "response": "r"}]}', "trajectories.0.prompt"),
        (b'{"trajectories": [{"key": "k", "prompt": "p", "response": "r", "metadata": {"a\\u0000": 1}}]}',
         "trajectories.0.metadata"),
    ],
)
def test_values_postgres_cannot_hold_are_422_not_500(api: Api, run: Run, raw: bytes, field: str) -> None:
    response = api.post(f"/runs/{run.pk}/trajectories", raw=raw)
    assert response.status_code == 422, response.content
    assert field in response.json()["errors"]
    assert not Experience.objects.filter(run=run).exists()


def test_a_body_that_is_not_json_is_400(api: Api, run: Run) -> None:
    response = api.post(f"/runs/{run.pk}/trajectories", raw=b"{not json")
    assert response.status_code == 400 and "not valid JSON" in response.json()["detail"]


def test_a_task_outside_the_runs_taskset_rejects_the_batch(api: Api, run: Run, owner: User) -> None:
    foreign = first_task(make_taskset(owner=owner))
    response = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj("a"), traj("b", task_id=foreign.pk)]})
    assert response.status_code == 422
    assert "not in this run's taskset" in response.json()["errors"]["trajectories.1.task_id"]
    assert not Experience.objects.filter(run=run).exists()


# ---- feedback ------------------------------------------------------------------------


def test_an_env_reward_sets_the_reward_of_a_waiting_experience(api: Api, run: Run, key: Any) -> None:
    exp_id = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj(reward=None, reward_parts={"a": 1.0})]}).json()["results"][0]["id"]
    response = api.post(f"/runs/{run.pk}/feedback", {"experience_id": exp_id, "kind": "env_reward", "value": 0.75,
                                                     "reward_parts": {"b": 0.5}})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["experience_status"], body["experience_reward"], body["late"]) == ("ready", 0.75, False)
    exp = Experience.objects.get(pk=exp_id)
    assert (exp.auto_reward, exp.reward, exp.status, exp.reward_parts) == (0.75, 0.75, "ready", {"a": 1.0, "b": 0.5})
    fb = Feedback.objects.get(pk=body["id"])
    assert fb.api_key_id == key[0].pk and fb.kind == "env_reward" and fb.author_id is None
    assert fb.value == body["value"] == {"reward": 0.75, "reward_parts": {"b": 0.5}}


def test_ratings_and_preferences_are_stored_without_touching_the_reward(api: Api, run: Run) -> None:
    a, b = make_experiences(run, groups=1, group_size=2)
    rating = api.post(f"/runs/{run.pk}/feedback", {"experience_id": a.pk, "kind": "rating", "value": 1, "comment": "off"})
    pair = api.post(f"/runs/{run.pk}/feedback", {"experience_id": a.pk, "kind": "pairwise",
                                                 "other_experience_id": b.pk, "preferred": "b"})
    assert rating.status_code == 200 and pair.status_code == 200
    assert Feedback.objects.get(pk=rating.json()["id"]).value == {"score": 1, "thumb": None, "normalised": 0.0}
    stored = Feedback.objects.get(pk=pair.json()["id"])
    assert stored.other_id == b.pk and stored.value == {"winner": "b"}
    a.refresh_from_db()
    assert a.reward == 0.0


def test_feedback_on_an_experience_already_trained_on_is_kept_as_late(api: Api, run: Run) -> None:
    [exp] = make_experiences(run, groups=1, group_size=1)
    Experience.objects.filter(pk=exp.pk).update(status="consumed")
    body = api.post(f"/runs/{run.pk}/feedback", {"experience_id": exp.pk, "kind": "env_reward", "value": 5}).json()
    assert body["late"] is True and body["experience_reward"] == exp.reward


def test_feedback_on_an_unknown_experience_is_404(api: Api, run: Run) -> None:
    response = api.post(f"/runs/{run.pk}/feedback", {"experience_id": 99999, "kind": "rating", "value": 1})
    assert response.status_code == 404 and "experience_id" in response.json()["errors"]
    assert not Feedback.objects.exists()


@pytest.mark.parametrize("body, field", [
    ({"kind": "rating", "value": -1}, "whole number from 1 to 5"),
    ({"kind": "rating", "value": 2.5}, "whole number from 1 to 5"),
    ({"kind": "rating", "score": 3, "thumb": "up"}, "a score (1-5) or a thumb"),
    ({"kind": "flag", "flags": ["boring"]}, "flags.0"),
    ({"kind": "ranking", "order": [1, 2], "experience_id": 1}, "not experience_id"),
])
def test_malformed_feedback_is_422_naming_the_problem_and_stores_nothing(api: Api, run: Run, body: dict[str, Any],
                                                                         field: str) -> None:
    [exp] = make_experiences(run, groups=1, group_size=1)
    response = api.post(f"/runs/{run.pk}/feedback", {"experience_id": exp.pk, **body})
    assert response.status_code == 422 and field in response.content.decode(), response.content
    assert not Feedback.objects.exists()


def test_feedback_needs_the_fields_of_its_kind(api: Api, run: Run) -> None:
    [exp] = make_experiences(run, groups=1, group_size=1)
    response = api.post(f"/runs/{run.pk}/feedback", {"experience_id": exp.pk, "kind": "pairwise"})
    assert response.status_code == 422 and "pairwise needs" in response.json()["detail"]
    assert not Feedback.objects.exists()


# ---- rollouts ------------------------------------------------------------------------


def test_rollouts_answer_503_when_no_rollout_worker_answers(api: Api, run: Run, settings: Any) -> None:
    settings.RFT_ROLLOUT_TIMEOUT_SECONDS = 0.5
    response = api.post(f"/runs/{run.pk}/rollouts", {"requests": [{"prompt": "1 + 1 ="}], "timeout_seconds": 30})
    assert response.status_code == 503
    assert "no rollout worker answered within 0.5 s" in response.json()["detail"]
    assert response["Retry-After"]


def test_the_web_process_stops_waiting_on_a_rollout_no_worker_answered(run: Run) -> None:
    """Celery's result backend keeps a result it waits on pending, with a Redis subscription,
    until the answer comes: one per request no worker answered, for the life of the process."""
    from apps.envapi.services import GENERATE_TASK, rollout_task_wait
    from rftweb.celery import app
    from kernel.exceptions import Unavailable

    def pending() -> int:  # this thread's backend (the API calls it from its executor's threads)
        return sum(len(waiting) for waiting in app.backend._pending_results)

    before = pending()
    with pytest.raises(Unavailable, match="no rollout worker answered within 0.3 s"):
        rollout_task_wait(task=GENERATE_TASK, args=[run.pk, [{"prompt": "1 + 1 ="}]], timeout=0.3)
    assert pending() == before


def test_a_rollout_request_needs_exactly_one_of_prompt_and_messages(api: Api, run: Run) -> None:
    response = api.post(f"/runs/{run.pk}/rollouts", {"requests": [{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}]})
    assert response.status_code == 422 and "requests.0" in response.json()["errors"]


# ---- the errors every endpoint shares ------------------------------------------------


@pytest.mark.parametrize("header", [None, "Bearer nope", "Bearer rft_abc_def", "Basic dXNlcjpwdw==", "Bearer rft_"])
def test_no_key_or_a_bad_key_is_401(run: Run, header: str | None) -> None:
    from django.test import Client

    headers = {"Authorization": header} if header else {}
    response = Client().get(f"/api/v1/runs/{run.pk}", headers=headers)
    assert response.status_code == 401 and "API key" in response.json()["detail"]


def test_a_key_without_the_action_is_403_and_writes_nothing(run: Run) -> None:
    api = Api(make_key(run, actions=["read"])[1])
    response = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj()]})
    assert response.status_code == 403 and "may not submit" in response.json()["detail"]
    assert not Experience.objects.exists()
    [exp] = make_experiences(run, groups=1, group_size=1)
    assert api.post(f"/runs/{run.pk}/feedback", {"experience_id": exp.pk, "kind": "rating", "value": 1}).status_code == 403
    assert Api(make_key(run, actions=["submit"])[1]).get(f"/runs/{run.pk}").status_code == 403


def test_a_body_past_the_limit_is_413_and_writes_nothing(api: Api, run: Run, settings: Any) -> None:
    settings.RFT_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    response = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj(response="x" * 3000)]})
    assert response.status_code == 413 and "2000 bytes" in response.json()["detail"]
    assert not Experience.objects.exists()


def test_over_the_rate_is_429_with_retry_after_and_writes_nothing(run: Run) -> None:
    api = Api(make_key(run, rate=2)[1])
    assert api.get("/runs").status_code == 200
    assert api.get("/runs").status_code == 200
    response = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj()]})
    assert response.status_code == 429 and "2 requests a minute" in response.json()["detail"]
    assert 1 <= int(response["Retry-After"]) <= 60
    assert not Experience.objects.exists()


def test_keys_have_separate_rate_windows(run: Run) -> None:
    slow, fast = Api(make_key(run, rate=1)[1]), Api(make_key(run, rate=100)[1])
    slow.get("/runs")
    assert slow.get("/runs").status_code == 429
    assert fast.get("/runs").status_code == 200


# ---- docs ----------------------------------------------------------------------------


def test_the_docs_page_serves_swagger_from_the_package_not_a_cdn(client: Any) -> None:
    from django.contrib.staticfiles import finders

    html = client.get("/api/v1/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html and "cdn" not in html.lower()
    assert finders.find("ninja/swagger-ui-bundle.js") and finders.find("ninja/swagger-ui.css")
    schema = client.get("/api/v1/openapi.json").json()
    assert "/api/v1/runs/{run_id}/trajectories" in schema["paths"]
    assert json.dumps(schema["components"]["schemas"]["RunConfig"]).count("repeat_times") >= 1


def test_rate_counting_reuses_one_redis_connection_across_asgi_requests(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ASGI `django.core.cache.cache` is per request context: counting there opened a new
    Redis connection (and pool) for every request, the largest CPU cost of the OpenAI endpoint's
    own work. Each call below runs in a fresh context, as daphne runs each request."""
    import asyncio
    import contextvars

    import redis.connection
    from asgiref.sync import sync_to_async

    from apps.envapi.services import rate_limit_hit

    key, _ = make_key(run, rate=4)
    connects: list[object] = []
    real = redis.connection.Connection._connect  # opens the socket (`connect` is called per command)

    def counted(self: Any) -> Any:
        connects.append(self)
        return real(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counted)
    rate_limit_hit(key=key)  # the process's counter connection, made once
    opened = len(connects)
    waits = [contextvars.Context().run(lambda: asyncio.run(sync_to_async(rate_limit_hit)(key=key))) for _ in range(5)]
    assert len(connects) == opened, f"{len(connects) - opened} new Redis connections for 5 requests"
    # And the window still counts: 4 allowed (one above, three here), then refused.
    assert waits[:3] == [None] * 3 and all(w is not None and 0 < w <= 60 for w in waits[3:])


def test_a_rollout_task_message_does_not_repr_the_request(run: Run) -> None:
    """Celery builds a repr of a task's arguments for the message headers unless told not to,
    walking every message of the request on the endpoint's CPU for each call; the headers name
    the run only."""
    from celery.signals import before_task_publish

    from apps.envapi.services import rollout_task_wait
    from kernel.exceptions import Unavailable

    sent: list[dict[str, Any]] = []

    def capture(headers: dict[str, Any], body: Any, **_: Any) -> None:
        sent.append({"headers": headers, "body": body})

    before_task_publish.connect(capture, weak=False)
    try:
        request = {"endpoint": "chat", "messages": [{"role": "user", "content": "2 + 2?"}]}
        with pytest.raises(Unavailable):  # no rollout worker in this test
            rollout_task_wait(task="workers.explore.chat.chat", args=[run.pk, request], timeout=0.2)
    finally:
        before_task_publish.disconnect(capture)
    [message] = sent
    assert "2 + 2?" in json.dumps(message["body"])
    assert message["headers"]["argsrepr"] == f"[{run.pk}, …]"
