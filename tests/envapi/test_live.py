"""The API served by a real ASGI server (daphne) on the test database: Schemathesis against
the served schema, live events, the Python client, and the example environment."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis.errors import Unsatisfiable

from apps.buffer.models import Experience, TaskAttempt
from apps.envapi.services import api_key_revoke
from apps.runs.events import event_publish
from apps.runs.models import Run
from examples import number_guess
from rftweb.client import ApiError, RftClient
from tests.envapi.conftest import make_key
from tests.factories import make_experiences, make_run, make_taskset, taskset_of
from tests.servers import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_served_schema_holds_no_5xx_and_every_response_matches_it(live_url: str, run: Run) -> None:
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation.modes import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    _, raw = make_key(run)
    headers = {"Authorization": f"Bearer {raw}"}
    def no_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
        # With no rollout worker beside this server, /rollouts answers its documented 503;
        # any other 5xx, anywhere, is a failure.
        if response.status_code == 503 and case.operation.path.endswith("/rollouts") and "no rollout worker" in response.text:
            return True
        return not_a_server_error(ctx, response, case)

    checks = [no_server_error, status_code_conformance, content_type_conformance,
              response_headers_conformance, response_schema_conformance]
    schema = schemathesis.openapi.from_url(f"{live_url}/api/v1/openapi.json")
    [exp] = make_experiences(run, groups=1, group_size=1)
    # Bodies whose rules span fields (token counts, one of prompt or messages) are seldom
    # generated valid, so the success paths also get one known-good request each.
    known_good: dict[str, Any] = {
        "/trajectories": {"trajectories": [{"key": "st-1", "messages": [{"role": "user", "content": "hi"}], "reward": 1}]},
        "/feedback": {"experience_id": exp.pk, "kind": "env_reward", "value": 0.5},
        "/rollouts": {"requests": [{"prompt": "1 + 1 ="}], "timeout_seconds": 1},
    }
    tried = []
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an Err raises here: the schema must load
        if operation.path.endswith("/events"):
            continue  # a stream, not a JSON document: covered by the events tests below
        tried.append(operation.label)
        for suffix, body in known_good.items():
            if operation.path.endswith(suffix):
                case = operation.Case(path_parameters={"run_id": run.pk}, body=body, media_type="application/json")
                response = case.call_and_validate(base_url=live_url, checks=checks, headers=headers)
                assert response.status_code == (503 if suffix == "/rollouts" else 200), response.text
        strategies = [
            # valid requests on the key's own run reach the handlers' success paths...
            operation.as_strategy(GenerationMode.POSITIVE, headers=headers,
                                  path_parameters={"run_id": run.pk} if "{run_id}" in operation.path else None),
            # ...and invalid ones (any run id, bad bodies) their error paths.
            operation.as_strategy(GenerationMode.NEGATIVE, headers=headers),
        ]
        for negative, strategy in enumerate(strategies):

            @given(case=strategy)
            @hsettings(max_examples=15, deadline=None, database=None,
                       suppress_health_check=list(HealthCheck))
            def check(case: Any) -> None:
                case.call_and_validate(base_url=live_url, checks=checks, headers=headers)

            try:
                check()
            except Unsatisfiable:
                # GET /runs takes no input at all: nothing can be made invalid.
                assert negative and "{run_id}" not in operation.path
    # The environment API, its exports, the agent sessions' finish, the raters figures,
    # the reward-model download (ask, state, zip), the K-12 grader versions, a person's waiting
    # count (GET /runs/{id}/annotation), the taskset's import progress (GET /runs/{id}/taskset) and
    # the owner's review of labels (list, accept, reject, disagreements, resolve) and the
    # experience browser's bulk actions, and the blind evaluations (create, list, next, vote,
    # close, figures, the votes' export: round 61): a new operation must be counted here, so it
    # cannot go untested.
    assert len(tried) == 35
    assert Experience.objects.filter(run=run, source="env").exists(), "no valid trajectory got through"


def test_live_events_stream_to_a_key_of_the_run(live_url: str, run: Run) -> None:
    _, raw = make_key(run, actions=["read"])
    with RftClient(live_url, raw) as client:
        stream = client.events(run.pk, max_seconds=20, max_events=2)
        assert next(stream)["type"] == "subscribed"
        event_publish(run_id=run.pk, type="weights.synced", payload={"version": 4, "note": "<b>x</b>\nline"})
        event_publish(run_id=run.pk, type="experience.created", payload={"id": 17})
        assert list(stream) == [
            {"type": "weights.synced", "payload": {"version": 4, "note": "<b>x</b>\nline"}},
            {"type": "experience.created", "payload": {"id": 17}},
        ]


def test_events_refuse_a_key_of_another_run_and_a_revoked_key(live_url: str, run: Run, owner: User) -> None:
    other = make_run(owner=owner, name="B")
    key, raw = make_key(run)
    with RftClient(live_url, raw, retries=0) as client:
        with pytest.raises(ApiError) as denied:
            next(client.events(other.pk, max_seconds=1))
        assert denied.value.status == 404  # as for a missing run: run ids cannot be probed
        api_key_revoke(key=key)
        with pytest.raises(ApiError) as revoked:
            next(client.events(run.pk, max_seconds=1))
        assert revoked.value.status == 401


def test_the_client_retries_429_then_gives_up_with_the_servers_message(live_url: str, run: Run) -> None:
    _, raw = make_key(run, rate=2)
    with RftClient(live_url, raw, retries=2, max_backoff=0.05) as client:
        client.runs()
        client.run(run.pk)
        with pytest.raises(ApiError) as exc:
            client.runs()
        assert exc.value.status == 429 and "2 requests a minute" in exc.value.detail
        assert client.attempts == 2 + 3


def test_the_client_retries_503_from_rollouts(live_url: str, run: Run) -> None:
    _, raw = make_key(run)
    with RftClient(live_url, raw, retries=1, backoff=0.01, max_backoff=0.05) as client:
        with pytest.raises(ApiError) as exc:
            client.generate(run.pk, [{"prompt": "1 + 1 ="}], timeout_seconds=5)
        assert exc.value.status == 503 and "rollout worker" in exc.value.detail
        assert client.attempts == 2


def test_the_client_retries_connection_errors() -> None:
    with RftClient("http://127.0.0.1:9", "rft_x_y", retries=2, backoff=0.01) as client:
        with pytest.raises(httpx.ConnectError):
            client.runs()
        assert client.attempts == 3


def test_the_client_field_errors_come_through(live_url: str, run: Run) -> None:
    _, raw = make_key(run)
    with RftClient(live_url, raw) as client:
        with pytest.raises(ApiError) as exc:
            client.submit_trajectory(run.pk, key="k", prompt="p", response="r", token_ids=[1, 2], prompt_length=1, logprobs=[])
        assert exc.value.status == 422 and "logprobs has 0 entries" in exc.value.errors["trajectories.0"]


def test_the_client_needs_only_httpx() -> None:
    code = ("import sys\nfor name in ('django', 'celery', 'kombu', 'ninja', 'pydantic'): sys.modules[name] = None\n"
            "import rftweb.client as c\nprint(sorted(n for n in ('django','celery','pydantic') if sys.modules.get(n)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- the example environment ---------------------------------------------------------


def _replayed_reward(exp: Experience) -> float:
    """Score the stored conversation again with the game's rules."""
    assert exp.task is not None and exp.messages is not None
    secret = int(exp.task.reference or "")
    meta = exp.task.metadata
    guesses = [number_guess.parse_guess(m["content"]) for m in exp.messages if m["role"] == "assistant"]
    solved = bool(guesses) and guesses[-1][0] == secret
    reward, _ = number_guess.reward_of(solved=solved, turns=len(guesses), max_turns=meta["max_turns"],
                                       well_formed=sum(ok for _, ok in guesses))
    return reward


def test_the_number_guessing_environment_lands_its_trajectories_with_rewards(live_url: str, owner: User) -> None:
    run = make_run(owner=owner, name="guessing")  # repeat_times 4: four episodes per game
    _, raw = make_key(run)
    code = number_guess.main(["--url", live_url, "--key", raw, "--run", str(run.pk), "--policy", "random",
                              "--add-tasks", "3", "--episodes", "12", "--high", "10", "--max-turns", "4"])
    assert code == 0
    exps = list(Experience.objects.filter(run=run).select_related("task"))
    assert len(exps) == 12 and {e.source for e in exps} == {"env"}
    assert all(e.status == "ready" and e.reward is not None for e in exps)
    assert all(set(e.reward_parts) == {"solved", "speed", "format"} for e in exps)
    assert all(e.reward == pytest.approx(_replayed_reward(e)) for e in exps)
    assert Experience.objects.filter(run=run).values("group_id").distinct().count() == 3
    assert TaskAttempt.objects.filter(run=run, status="done").count() == 3
    assert any(len(e.messages or []) > 3 for e in exps), "no episode took more than one turn"


# ---- keys across runs, over HTTP -----------------------------------------------------


def test_a_key_of_run_a_can_neither_read_nor_write_run_b(live_url: str, run: Run, owner: User) -> None:
    run_b = make_run(owner=owner, name="B", taskset=make_taskset(owner=owner))
    [exp_b] = Experience.objects.bulk_create([Experience(run=run_b, key="b1", group_id="g")])
    _, raw = make_key(run)
    with RftClient(live_url, raw, retries=0) as client:
        assert [r["id"] for r in client.runs()] == [run.pk]
        calls = [
            lambda: client.run(run_b.pk),
            lambda: client.claim_tasks(run_b.pk),
            lambda: client.add_tasks(run_b.pk, [{"prompt": "x"}]),
            lambda: client.submit_trajectory(run_b.pk, key="sneak", prompt="p", response="r", reward=1),
            lambda: client.feedback(run_b.pk, experience_id=exp_b.pk, kind="env_reward", value=1),
            lambda: client.feedback(run.pk, experience_id=exp_b.pk, kind="env_reward", value=1),
        ]
        statuses = []
        for call in calls:
            with pytest.raises(ApiError) as exc:
                call()
            statuses.append(exc.value.status)
    # Another run's ids answer as missing ones (issue #33); so does another run's experience.
    assert statuses == [404, 404, 404, 404, 404, 404]
    assert list(Experience.objects.filter(run=run_b).values_list("key", flat=True)) == ["b1"]
    assert taskset_of(run_b).tasks.count() == 4 and not TaskAttempt.objects.filter(run=run_b).exists()
    assert Experience.objects.get(pk=exp_b.pk).reward is None


def test_a_revoked_key_stops_working_at_once(live_url: str, run: Run) -> None:
    key, raw = make_key(run)
    with RftClient(live_url, raw, retries=0) as client:
        assert client.run(run.pk)["id"] == run.pk
        api_key_revoke(key=key)
        with pytest.raises(ApiError) as exc:
            client.submit_trajectory(run.pk, key="after", prompt="p", response="r", reward=1)
        assert exc.value.status == 401
    assert not Experience.objects.filter(run=run).exists()


def test_the_docs_page_loads_its_assets_from_this_server(live_url: str) -> None:
    html = httpx.get(f"{live_url}/api/v1/docs").text
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
    assert assets and all(a.startswith("/static/") for a in assets)


def test_a_steps_experiences_cross_the_layer_as_one_message_and_stream_one_event_each(live_url: str, run: Run) -> None:
    """An explore step announces its rollouts together: one layer message for the lot (an
    envelope), which the API's event stream unpacks into one server-sent event per
    experience, in order, counting each against max_events."""
    from apps.buffer.services import experience_write
    from tests.factories import experience_row

    _, raw = make_key(run, actions=["read"])
    rows = [experience_row(run, key=f"env-{i}", group="g", response_text=f"<answer>{i}</answer>") for i in range(12)]
    with RftClient(live_url, raw) as client:
        stream = client.events(run.pk, max_seconds=20, max_events=10)
        assert next(stream)["type"] == "subscribed"
        with transaction.atomic():  # announced when the write commits, as the explorer's is
            written = experience_write(experiences=rows, announce=True)
        got = list(stream)
    assert [e["type"] for e in got] == ["experience.created"] * 10  # stopped at max_events, mid-envelope
    assert [e["payload"]["id"] for e in got] == list(written.ids[:10])
    assert [e["payload"]["response"] for e in got] == [f"<answer>{i}</answer>" for i in range(10)]
