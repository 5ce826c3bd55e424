"""The explorer on real Postgres and Redis: in this process for the logic, and through a real
Celery worker subprocess with a websocket client listening on the run's stream."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience, TaskAttempt
from apps.buffer.services import task_attempts_create
from apps.runs.models import Metric, Run, WeightLoad
from apps.runs.services import model_version_publish, run_transition
from tests.factories import make_run, make_taskset
from workers.explore.explorer import (
    GenerateRequestInvalid,
    explore,
    explorer_version_for,
    generate_completions,
)
from apps.runs.ports import run_view_of

FORMAT: list[dict[str, Any]] = [{"name": "regex", "params": {"pattern": r"^<answer>-?\d+</answer>$"}}]


def demo_run(owner: User, model_dir: Path, *, tasks: int = 3, **config: Any) -> Run:
    defaults: dict[str, Any] = {
        "model": str(model_dir),
        "repeat_times": 3,
        "explore_batch_size": tasks,
        "rewards": FORMAT,
        "sampling": {"temperature": 1.0, "max_tokens": 12, "seed": 0},
    }
    defaults.update(config)
    run = make_run(owner=owner, taskset=make_taskset(tasks, owner=owner), **defaults)
    run_transition(run=run, action="start")
    task_attempts_create(run=run, epoch=0)
    return run


def assert_explored(run: Run, *, tasks: int, n: int, version: int) -> list[Experience]:
    experiences = list(Experience.objects.filter(run=run).order_by("id"))
    assert len(experiences) == tasks * n
    assert len({e.group_id for e in experiences}) == tasks
    for e in experiences:
        assert e.model_version == version
        assert e.source == "explorer"
        assert 0 < e.prompt_length < len(e.token_ids) and e.logprobs is not None
        assert len(e.logprobs) == len(e.token_ids) - e.prompt_length
        assert all(lp <= 0 for lp in e.logprobs)
        assert e.status == "ready" and e.reward == e.auto_reward
        assert e.reward_parts == {"regex": e.reward}
        assert e.prompt_text.startswith("What is")
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", "model_version")) == {("done", version)}
    return experiences


@pytest.mark.django_db
def test_an_explore_step_writes_one_scored_experience_per_completion(owner: User, demo_model_dir: Path, hf_engine: Any) -> None:
    run = demo_run(owner, demo_model_dir)
    summary = explore(run_id=run.pk, step=1)
    assert summary["experiences"] == 9 and summary["tasks"] == 3
    experiences = assert_explored(run, tasks=3, n=3, version=0)
    # The scores are the format reward of the text actually stored.
    import re

    for e in experiences:
        assert e.reward == float(re.search(FORMAT[0]["params"]["pattern"], e.response_text) is not None)
    names = set(Metric.objects.filter(run=run, step=1).values_list("name", flat=True))
    assert {"explore/reward_mean", "explore/reward_std", "explore/response_length", "explore/tokens_per_second",
            "explore/generate_seconds", "explore/step_seconds"} <= names
    run.refresh_from_db()
    assert run.explore_step == 1


@pytest.mark.django_db
def test_a_used_up_taskset_ends_exploring_instead_of_stalling_the_run(owner: User, demo_model_dir: Path, hf_engine: Any) -> None:
    run = demo_run(owner, demo_model_dir, tasks=2, total_steps=5, epochs=1, mode="explore")
    assert explore(run_id=run.pk, step=1)["tasks"] == 2
    summary = explore(run_id=run.pk, step=2)
    assert summary["tasks"] == 0 and summary["exhausted"] is True
    run.refresh_from_db()
    assert run.explore_step == 5


@pytest.mark.django_db
def test_a_run_whose_tasks_are_leased_elsewhere_waits_for_them(owner: User, demo_model_dir: Path, hf_engine: Any) -> None:
    from apps.buffer.services import task_claim

    run = demo_run(owner, demo_model_dir, tasks=2, total_steps=5, epochs=1, mode="explore")
    task_claim(run=run, worker="other", size=2)
    summary = explore(run_id=run.pk, step=1)
    assert summary["tasks"] == 0 and "exhausted" not in summary
    run.refresh_from_db()
    assert run.explore_step == 0


@pytest.mark.django_db
def test_a_worker_whose_earlier_try_could_not_hand_its_tasks_back_explores_them_next(
    owner: User, demo_model_dir: Path, hf_engine: Any,
) -> None:
    """Postgres went away mid-step: the claim had committed, the release on the way out could
    not. The worker's next step (Celery's retry, or the step sent again) takes them back at
    once; the run's last step no longer waits the lease out (tests/test_faults.py did, once)."""
    from apps.buffer.services import task_claim

    run = demo_run(owner, demo_model_dir, tasks=2, total_steps=5, epochs=1, mode="explore")
    task_claim(run=run, worker="explorer-1", size=2)  # the try that died
    summary = explore(run_id=run.pk, step=1, worker="explorer-1")
    assert summary["tasks"] == 2 and summary["experiences"] == 6
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", "lease_owner")) == {("done", "")}


@pytest.mark.django_db
def test_an_earlier_try_s_leases_are_handed_back_even_when_other_tasks_are_queued(
    owner: User, demo_model_dir: Path, hf_engine: Any,
) -> None:
    """The same, with more tasks than a batch: the retry's claim finds other queued tasks, and
    the dead try's leases must not stay out until they expire (the run cannot end while a task
    is leased; CI's fault test waited 300 s for it)."""
    from apps.buffer.services import task_claim

    run = demo_run(owner, demo_model_dir, tasks=4, explore_batch_size=2, total_steps=5, epochs=1, mode="explore")
    stale = {a.pk for a in task_claim(run=run, worker="explorer-1", size=2)}  # the try that died
    assert explore(run_id=run.pk, step=1, worker="explorer-1")["tasks"] == 2
    assert not TaskAttempt.objects.filter(run=run, status="leased").exists()
    # The explored batch is the first two in queue order again: the stale ones, handed back.
    assert set(TaskAttempt.objects.filter(run=run, status="done").values_list("pk", flat=True)) == stale


@pytest.mark.django_db
def test_a_paused_or_stopped_run_gets_nothing_explored(owner: User, demo_model_dir: Path) -> None:
    run = demo_run(owner, demo_model_dir)
    run_transition(run=run, action="pause")
    assert explore(run_id=run.pk, step=1)["skipped"] == "run is paused"
    run_transition(run=run, action="stop")
    assert explore(run_id=run.pk, step=2)["skipped"] == "run is stopped"
    assert not Experience.objects.filter(run=run).exists()
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", flat=True)) == {"queued"}


@pytest.mark.django_db
def test_it_explores_with_a_newly_published_version_and_records_the_load(
    owner: User, demo_model_dir: Path, hf_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.runs import services
    from apps.runs.events import event_publish as publish
    from tests.workers.test_engines import perturbed_copy

    sent: list[tuple[str, dict[str, Any]]] = []
    def recorded(*, run_id: int, type: str, payload: dict[str, Any]) -> Any:
        sent.append((type, payload))
        return publish(run_id=run_id, type=type, payload=payload)

    monkeypatch.setattr(services, "event_publish", recorded)

    run = demo_run(owner, demo_model_dir, tasks=2)
    checkpoint = perturbed_copy(demo_model_dir, tmp_path / "v1")
    model_version_publish(run=run, number=1, checkpoint=str(checkpoint), train_step=1)
    run.refresh_from_db()
    assert explorer_version_for(run=run_view_of(run), step=2) == 1
    try:
        explore(run_id=run.pk, step=2)
    finally:
        hf_engine.load(version=0, path=str(demo_model_dir))
    assert_explored(run, tasks=2, n=3, version=1)
    assert WeightLoad.objects.filter(run=run, version=1).count() == 1
    loads = [p for t, p in sent if t == "weights.synced" and p["event"] == "loaded" and p["version"] == 1]
    assert len(loads) == 1 and loads[0]["via"] == "checkpoint" and loads[0]["seconds"] > 0
    assert loads[0]["bytes"] == sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) > 0


@pytest.mark.django_db
def test_remote_reward_terms_leave_experiences_pending_and_name_what_they_await(
    owner: User, demo_model_dir: Path, hf_engine: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from kernel.rewards import RewardResult, register

    @register("test_slow_judge", where="reward")
    def slow_judge(completion: str, task: Any, **params: Any) -> RewardResult:
        raise AssertionError("a remote term must not run inside the explorer")

    import redis
    from django.conf import settings

    # The judge twice, with two weights: each is awaited under its own key.
    run = demo_run(owner, demo_model_dir, tasks=1, rewards=[*FORMAT, {"name": "test_slow_judge", "weight": 2.0},
                                                           {"name": "test_slow_judge", "weight": 0.5}])
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("reward")
    with django_capture_on_commit_callbacks(execute=True):
        explore(run_id=run.pk, step=1)
    experiences = list(Experience.objects.filter(run=run).order_by("id"))
    assert len(experiences) == 3
    for e in experiences:
        assert e.status == "pending" and e.reward is None
        assert e.metadata["awaiting_rewards"] == ["test_slow_judge", "test_slow_judge#2"]
        assert set(e.reward_parts) == {"regex"}
    # One message on the reward queue names the scoring task and these experiences.
    messages = [json.loads(m) for m in broker.lrange("reward", 0, -1)]
    broker.delete("reward")
    assert [m["headers"]["task"] for m in messages] == ["workers.reward.scoring.score_experiences"]
    assert json.loads(base64.b64decode(messages[0]["body"]))[0] == [run.pk, [e.pk for e in experiences]]


@pytest.mark.django_db
def test_a_reward_that_crashes_scores_zero_and_the_step_completes(owner: User, demo_model_dir: Path, hf_engine: Any) -> None:
    # One broken scorer on untrusted text must not lose the step (apps/rewards/scoring.py).
    from kernel.rewards import RewardResult, register

    @register("test_crashing_rule")
    def crashing(completion: str, task: Any, **params: Any) -> RewardResult:
        raise RuntimeError("scorer bug")

    run = demo_run(owner, demo_model_dir, tasks=2, rewards=[{"name": "test_crashing_rule"}])
    explore(run_id=run.pk, step=1)
    rewards = set(Experience.objects.filter(run=run).values_list("reward", flat=True))
    assert rewards == {0.0}
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", flat=True)) == {"done"}


def test_a_failed_write_hands_the_tasks_back(owner: User, demo_model_dir: Path, hf_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel.exceptions import InvalidInput

    def reject(**kwargs: Any) -> Any:
        raise InvalidInput("simulated", field="0.key")

    # The explorer writes through the buffer's port (ExperienceSink), in one transaction.
    monkeypatch.setattr("apps.buffer.ports.experience_write", reject)
    run = demo_run(owner, demo_model_dir, tasks=2)
    with pytest.raises(InvalidInput):
        explore(run_id=run.pk, step=1)
    assert not Experience.objects.filter(run=run).exists()
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", "lease_owner")) == {("queued", "")}


class StageFailed(Exception):
    pass


# Each stage of a step, by the name it reaches through: claim -> generate (prompts, then the
# engine) -> score -> write -> record.
STAGES = {
    "prompt": "workers.explore.explorer.task_prompt",
    "generate": "engine",
    "score": "workers.explore.explorer.rewards_inline",
    "write": "workers.explore.explorer.explore_step_write",
    "record": "workers.explore.explorer.metric_record",
}


@pytest.mark.django_db
@pytest.mark.parametrize("stage", list(STAGES))
def test_an_exception_in_any_stage_leaves_no_task_held(
        owner: User, demo_model_dir: Path, hf_engine: Any, monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    """One context manager (tasks_held) hands the claimed attempts back on every path: before
    the write they are queued again at once, not when their lease runs out; after it they are done."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise StageFailed(stage)

    if STAGES[stage] == "engine":
        monkeypatch.setattr(hf_engine, "generate", fail)
    else:
        monkeypatch.setattr(STAGES[stage], fail)
    run = demo_run(owner, demo_model_dir, tasks=2)
    with pytest.raises(StageFailed):
        explore(run_id=run.pk, step=1, worker="explorer-a")
    status = "done" if stage == "record" else "queued"
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", "lease_owner")) == {(status, "")}
    assert Experience.objects.filter(run=run).count() == (6 if stage == "record" else 0)


@pytest.mark.django_db
def test_a_run_paused_while_it_generated_gets_its_tasks_back(
        owner: User, demo_model_dir: Path, hf_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = demo_run(owner, demo_model_dir, tasks=2)
    monkeypatch.setattr("workers.explore.explorer.run_status", lambda run_id: "paused")
    assert explore(run_id=run.pk, step=1)["skipped"] == "run left running during the step"
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", "lease_owner")) == {("queued", "")}
    assert not Experience.objects.filter(run=run).exists()


@pytest.mark.django_db
def test_a_step_whose_tasks_were_handed_back_while_it_generated_writes_nothing_and_goes_again(
        owner: User, demo_model_dir: Path, hf_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop hands a worker's leased tasks back when it judges the worker dead (its
    heartbeat late under load, as tests/test_faults.py once saw). A step still generating must
    not then record itself: it did, the next step claimed the same tasks, found every
    experience a duplicate, and the run stalled, its trainer waiting for a batch."""
    import workers.explore.explorer as explorer_mod
    from apps.buffer.services import task_release

    run = demo_run(owner, demo_model_dir, tasks=2)
    prompt_of = explorer_mod.task_prompt

    def handed_back_meanwhile(engine: Any, task: Any) -> Any:
        task_release(run=run, worker="explorer-a")  # the loop's call for a worker it judged dead
        return prompt_of(engine, task)

    monkeypatch.setattr(explorer_mod, "task_prompt", handed_back_meanwhile)
    lost = explore(run_id=run.pk, step=1, worker="explorer-a")
    assert lost["skipped"] == "its tasks were handed back while it generated", lost
    assert not Experience.objects.filter(run=run).exists()
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", flat=True)) == {"queued"}
    run.refresh_from_db()
    assert run.explore_step == 0

    monkeypatch.undo()
    again = explore(run_id=run.pk, step=1, worker="explorer-b")
    assert (again["experiences"], again["duplicates"]) == (6, 0), again
    assert_explored(run, tasks=2, n=3, version=0)
    run.refresh_from_db()
    assert run.explore_step == 1


@pytest.mark.django_db
def test_generate_answers_free_form_requests_with_tokens_and_logprobs(owner: User, demo_model_dir: Path, hf_engine: Any) -> None:
    run = demo_run(owner, demo_model_dir, tasks=1)
    out = generate_completions(
        run_id=run.pk,
        requests=[
            {"prompt": "What is 12 + 3?", "n": 2, "temperature": 0.0, "max_tokens": 12},
            {"messages": [{"role": "user", "content": "What is 40 - 1?"}], "sampling": {"max_tokens": 4}},
        ],
    )
    assert [(c["request"], c["index"]) for c in out] == [(0, 0), (0, 1), (1, 0)]
    assert out[0]["token_ids"] == out[1]["token_ids"]  # greedy
    assert len(out[2]["token_ids"]) <= 4
    for c in out:
        assert len(c["logprobs"]) == len(c["token_ids"]) and c["model_version"] == 0
        assert hf_engine.tokenizer.decode(c["prompt_token_ids"]).startswith("<|user|>What is")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([], "non-empty list"),
        ([{"n": 2}], "request 0: give exactly one of prompt or messages"),
        ([{"prompt": "hi"}, {"prompt": "x", "n": 0}], "request 1: n must be"),
        ([{"prompt": "hi", "sampling": {"temprature": 1}}], "unknown sampling parameters: temprature"),
        ([{"messages": [{"role": "user"}]}], "messages must be"),
    ],
)
def test_generate_rejects_malformed_requests_naming_them(owner: User, demo_model_dir: Path, requests: Any, message: str) -> None:
    run = demo_run(owner, demo_model_dir, tasks=1)
    with pytest.raises(GenerateRequestInvalid, match=message):
        generate_completions(run_id=run.pk, requests=requests)


async def _events(communicator: WebsocketCommunicator, *, count: int, timeout: float) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len([e for e in seen if e["type"] == "experience.created"]) < count:
        frame = await communicator.receive_json_from(timeout=max(0.1, deadline - loop.time()))
        # Events that arrive together come as one batch frame, in order.
        seen.extend(frame["events"] if frame["type"] == "batch" else [frame])
    return [e for e in seen if e["type"] == "experience.created"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
async def test_a_celery_worker_explores_and_a_websocket_client_sees_each_experience(
    demo_model_dir: Path, celery_rollout_worker: Any
) -> None:
    from rftweb.asgi import application
    from tests.factories import make_user
    from workers.explore.explorer import explore_step

    owner = make_user("owner")
    run = demo_run(owner, demo_model_dir, tasks=2)
    client = Client()
    client.force_login(owner)
    communicator = WebsocketCommunicator(
        application,
        f"/ws/runs/{run.pk}/",
        headers=[(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()), (b"origin", b"http://localhost")],
    )
    connected, _ = await communicator.connect(timeout=30)
    assert connected
    try:
        result = explore_step.delay(run.pk, 1)
        events = await _events(communicator, count=6, timeout=120)
        summary = await asyncio.to_thread(result.get, timeout=60)
    finally:
        await communicator.disconnect()
    assert summary["experiences"] == 6
    experiences = assert_explored(run, tasks=2, n=3, version=0)
    assert sorted(e["payload"]["id"] for e in events) == [e.pk for e in experiences]
    by_id = {e.pk: e for e in experiences}
    for event in events:
        payload = event["payload"]
        stored = by_id[payload["id"]]
        assert payload["response"] == stored.response_text and payload["reward"] == stored.reward
        assert payload["group_id"] == stored.group_id and payload["model_version"] == 0
        assert payload["status"] == "ready" and payload["prompt"] == stored.prompt_text
    # The worker recorded that it loaded the base model.
    assert WeightLoad.objects.filter(run=run, version=0).exists()

    # A retry of the same attempts (their finish lost, as when a worker dies after writing)
    # writes nothing twice.
    keys = sorted(Experience.objects.filter(run=run).values_list("key", flat=True))
    TaskAttempt.objects.filter(run=run).update(status="queued", lease_owner="", lease_expires_at=None)
    await asyncio.to_thread(Run.objects.filter(pk=run.pk).update, explore_step=0)  # committed with the finish
    again = await asyncio.to_thread(explore_step.delay(run.pk, 1).get, timeout=120)
    assert again["experiences"] == 0 and again["duplicates"] == 6
    assert sorted(Experience.objects.filter(run=run).values_list("key", flat=True)) == keys
    assert set(TaskAttempt.objects.filter(run=run).values_list("status", flat=True)) == {"done"}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_generate_task_answers_through_the_celery_worker(owner: User, demo_model_dir: Path, celery_rollout_worker: Any) -> None:
    from workers.explore.explorer import generate

    run = demo_run(owner, demo_model_dir, tasks=1)
    out = generate.delay(run.pk, [{"prompt": "What is 7 + 2?", "n": 2, "max_tokens": 8}]).get(timeout=120)
    assert len(out) == 2 and all(len(c["logprobs"]) == len(c["token_ids"]) for c in out)


# Transactional, so it runs after the Celery tests: a vLLM engine alive in this process has
# been seen to delay the websocket test's events past the channel layer's expiry.
@pytest.mark.vllm
@pytest.mark.django_db(transaction=True)
def test_the_explorer_runs_on_the_vllm_engine(owner: User, demo_model_dir: Path, vllm_engine: Any) -> None:
    run = demo_run(owner, demo_model_dir, tasks=2, engine="vllm")
    explore(run_id=run.pk, step=1)
    assert_explored(run, tasks=2, n=3, version=0)
