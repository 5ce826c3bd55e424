"""Rollouts through a real Celery worker on the `rollout` queue (`workers.explore.explorer.generate`),
and the example environment driving the model through the API."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from examples import number_guess
from rftweb.client import RftClient
from tests.envapi.conftest import make_key
from tests.factories import make_run
from tests.servers import rollout_stack as live_rollout_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("model") / "tiny", seed=0)


@pytest.fixture(scope="module")
def rollout_stack(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_rollout_stack(logs=tmp_path_factory.mktemp("stack"), name="rollouts") as url:
        yield url


def test_rollouts_return_completions_with_token_ids_and_logprobs(rollout_stack: str, model_dir: Path, owner: User) -> None:
    run = make_run(owner=owner, model=str(model_dir), engine="transformers")
    _, raw = make_key(run)
    with RftClient(rollout_stack, raw, timeout=320) as client:
        start = time.monotonic()
        results = client.generate(run.pk, [
            {"prompt": "1 + 1 =", "n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 1},
            {"messages": [{"role": "user", "content": "Guess a number"}], "n": 1, "max_tokens": 8},
        ], timeout_seconds=300)
    assert time.monotonic() - start < 300
    assert [len(r["completions"]) for r in results] == [2, 1]
    for result in results:
        assert result["model_version"] == 0 and result["prompt_token_ids"]
        for completion in result["completions"]:
            assert 1 <= len(completion["token_ids"]) <= 8
            assert len(completion["logprobs"]) == len(completion["token_ids"])
            assert all(lp <= 0 for lp in completion["logprobs"]) and completion["finish_reason"]


def test_the_example_environment_plays_the_platform_model(rollout_stack: str, model_dir: Path, owner: User) -> None:
    run = make_run(owner=owner, model=str(model_dir), engine="transformers", repeat_times=2)
    _, raw = make_key(run)
    code = number_guess.main(["--url", rollout_stack, "--key", raw, "--run", str(run.pk), "--policy", "platform",
                              "--add-tasks", "1", "--episodes", "2", "--max-turns", "2", "--max-tokens", "6",
                              "--timeout", "300"])
    assert code == 0
    exps: list[Any] = list(Experience.objects.filter(run=run))
    assert len(exps) == 2 and all(e.reward is not None and e.source == "env" for e in exps)
    for e in exps:
        assert [m["role"] for m in e.messages][:3] == ["system", "user", "assistant"]
        if e.token_ids:
            response = len(e.token_ids) - e.prompt_length
            assert len(e.logprobs) == len(e.action_mask) == response and 1 in e.action_mask
