"""Agent sessions to experiences: how recorded calls assemble, where they split, what expires,
and what the finish endpoint answers. Calls are recorded as the endpoint records them (the
whole path through a live server and worker is tests/envapi/test_openai_endpoint.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.buffer.models import Experience
from apps.envapi import agent_sessions as sessions
from apps.envapi.models import AgentSession
from apps.envapi.openai_services import OpenAIError
from apps.runs.models import Run
from tests.envapi.conftest import Api
from tests.factories import first_task

pytestmark = pytest.mark.django_db


def _answer(prompt: list[int], *choices: list[int], version: int = 0) -> dict[str, Any]:
    return {"model_version": version, "prompts": [{"prompt_token_ids": prompt, "choices": [
        {"token_ids": c, "logprobs": [-0.5 - i for i in range(len(c))], "finish_reason": "stop", "text": f"t{c}"}
        for c in choices]}]}


def _record(run: Run, key: Any, name: str, answer: dict[str, Any], task: int | None = None) -> None:
    sessions.call_record(run=run, key=key, session=sessions.SessionRef(name=name, task_id=task), endpoint="chat", answer=answer)


def test_calls_that_extend_each_other_become_one_experience_masked_on_the_samples(run: Run, key: Any) -> None:
    k, _ = key
    _record(run, k, "s", _answer([1, 2, 3], [10, 11]))
    _record(run, k, "s", _answer([1, 2, 3, 10, 11, 4, 5], [12]))
    _record(run, k, "s", _answer([1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], version=1))
    result = sessions.session_finish(run=run, name="s", reward=0.5)
    [exp] = Experience.objects.filter(pk__in=result.experience_ids)
    assert exp.token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14] and exp.prompt_length == 3
    assert exp.action_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert exp.logprobs == [-0.5, -1.5, 0.0, 0.0, -0.5, 0.0, -0.5, -1.5]
    assert exp.model_version == 0 and exp.metadata["turn_versions"] == [0, 0, 1]
    assert result.splits == [] and exp.reward == 0.5 and exp.status == "ready"


def test_a_call_whose_sampled_text_decodes_to_nul_is_recorded(run: Run, key: Any) -> None:
    from apps.envapi.models import AgentCall

    k, _ = key
    answer = _answer([1, 2], [0, 5])
    answer["prompts"][0]["choices"][0]["text"] = "<answer>4\x00</answer>"
    _record(run, k, "nul", answer)
    [call] = AgentCall.objects.filter(session__name="nul")
    assert call.choices[0]["text"] == "<answer>4\ufffd</answer>" and call.choices[0]["token_ids"] == [0, 5]


def test_a_prompt_that_rewrites_the_history_splits_the_trajectory_and_says_where(run: Run, key: Any) -> None:
    k, _ = key
    _record(run, k, "s", _answer([1, 2], [10, 11]))
    _record(run, k, "s", _answer([1, 2, 99, 4], [12]))  # the client re-rendered turn 1 differently
    result = sessions.session_finish(run=run, name="s", reward=1.0)
    exps = list(Experience.objects.filter(pk__in=result.experience_ids).order_by("id"))
    assert [e.token_ids for e in exps] == [[1, 2, 10, 11], [1, 2, 99, 4, 12]]
    assert [e.action_mask for e in exps] == [[1, 1], [1]]
    assert result.splits == [{"call": 1, "reason": "the prompt differs from the tokens before it at token 2 of 4"}]
    assert {e.group_id for e in exps} == {exps[0].group_id} and all(e.reward == 1.0 for e in exps)
    assert [e.metadata["part"] for e in exps] == [0, 1]


def test_of_n_choices_the_one_the_next_prompt_continues_is_kept(run: Run, key: Any) -> None:
    k, _ = key
    _record(run, k, "s", _answer([1], [10], [20, 21], [30]))
    _record(run, k, "s", _answer([1, 20, 21, 5], [40]))
    [exp] = Experience.objects.filter(pk__in=sessions.session_finish(run=run, name="s", reward=1.0).experience_ids)
    assert exp.token_ids == [1, 20, 21, 5, 40] and exp.action_mask == [1, 1, 0, 1]


def test_sessions_of_one_task_share_a_group(run: Run, key: Any) -> None:
    k, _ = key
    task = first_task(run)
    for name in ("a", "b"):
        _record(run, k, name, _answer([1, 2], [3]), task=task.pk)
        sessions.session_finish(run=run, name=name, reward=1.0)
    groups = set(Experience.objects.filter(run=run).values_list("group_id", flat=True))
    assert groups == {f"env:agent-task-{task.pk}"}


def test_a_session_nobody_finishes_is_abandoned_and_trains_nothing(run: Run, key: Any, settings: Any) -> None:
    k, _ = key
    settings.RFT_AGENT_SESSION_TTL_SECONDS = 60
    _record(run, k, "late", _answer([1], [2]))
    AgentSession.objects.filter(name="late").update(last_call_at=timezone.now() - timedelta(seconds=61))
    assert sessions.sessions_expire() == 1
    assert AgentSession.objects.get(name="late").status == "abandoned"
    with pytest.raises(sessions.SessionRejected, match="abandoned"):
        sessions.session_finish(run=run, name="late", reward=1.0)
    with pytest.raises(OpenAIError) as closed:
        _record(run, k, "late", _answer([1], [2]))
    assert closed.value.status == 400 and closed.value.openai_code == "session_closed"
    assert not Experience.objects.filter(run=run).exists()


def test_a_task_outside_the_runs_taskset_is_refused(run: Run, key: Any) -> None:
    k, _ = key
    with pytest.raises(OpenAIError) as bad:
        _record(run, k, "s", _answer([1], [2]), task=10**9)
    assert bad.value.param == "X-Rft-Task"


def test_the_finish_endpoint_answers_404_409_and_422_without_writing(run: Run, key: Any, api: Api) -> None:
    k, _ = key
    assert api.post(f"/runs/{run.pk}/sessions/nobody/finish", {"reward": 1}).status_code == 404
    AgentSession.objects.create(run=run, name="empty", api_key=k)
    assert api.post(f"/runs/{run.pk}/sessions/empty/finish", {"reward": 1}).status_code == 409
    _record(run, k, "ok", _answer([1], [2]))
    bad = api.post(f"/runs/{run.pk}/sessions/ok/finish", {"reward": "lots"})
    assert bad.status_code == 422 and "reward" in bad.json()["errors"]
    assert not Experience.objects.filter(run=run).exists()
    good = api.post(f"/runs/{run.pk}/sessions/ok/finish", {"reward": 1, "reward_parts": {"tool": 0.5}})
    assert good.status_code == 200 and good.json()["turns"] == 1


def test_an_assembled_session_trains_only_on_what_the_model_sampled(run: Run, key: Any) -> None:
    """The experience as the trainer reads it: its tokens that came from the environment
    are context, the sampled ones are trained on."""
    from workers.algorithms import rollout_from_experience

    k, _ = key
    _record(run, k, "s", _answer([1, 2], [10, 11]))
    _record(run, k, "s", _answer([1, 2, 10, 11, 7, 8, 9], [12]))
    [exp] = Experience.objects.filter(pk__in=sessions.session_finish(run=run, name="s", reward=1.0).experience_ids)
    rollout = rollout_from_experience(exp)
    assert rollout.completion_ids == [10, 11, 7, 8, 9, 12] and rollout.action_count == 3
    assert rollout.trained_mask == [1, 1, 0, 0, 0, 1]


def test_the_beat_marks_sessions_nobody_finished_abandoned(run: Run, key: Any, settings: Any) -> None:
    """The housekeeping task the beat schedules, not only the service: a session idle past the
    TTL is abandoned, a fresh one stays open."""
    from apps.envapi.tasks import agent_sessions_expire_task
    from rftweb.celery import app

    k, _ = key
    settings.RFT_AGENT_SESSION_TTL_SECONDS = 60
    _record(run, k, "idle", _answer([1], [2]))
    _record(run, k, "busy", _answer([1], [2]))
    AgentSession.objects.filter(name="idle").update(last_call_at=timezone.now() - timedelta(seconds=61))
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert agent_sessions_expire_task.name in scheduled
    assert agent_sessions_expire_task.apply().get() == 1
    assert dict(AgentSession.objects.values_list("name", "status")) == {"idle": "abandoned", "busy": "open"}
