"""How a chat call's answer gets back to the web process: pushed by the worker onto a Redis
list the endpoint waits on (apps/envapi/token_stream.py), not through Celery's result backend.
Every call in tests/envapi/test_openai_endpoint.py goes this way; here, what can go wrong."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User

from apps.envapi import token_stream
from tests.envapi.conftest import make_key
from tests.factories import make_run
from tests.servers import rollout_stack


@pytest.fixture(scope="module")
def stack(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The wait for an answer is long: a failure must not have to sit it out.
    with django_db_blocker.unblock(), rollout_stack(logs=tmp_path_factory.mktemp("openai-reply-stack"), name="openai-reply") as url:
        yield url


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_fails_answers_502_at_once_not_after_the_wait(stack: str, owner: User, tmp_path: Any) -> None:
    from apps.runs.models import Run

    run = make_run(owner=owner, engine="transformers", name="broken")
    # Its model gone after the run was made (the config check at creation would refuse it):
    # the worker's engine load raises.
    Run.objects.filter(pk=run.pk).update(config={**run.config, "model": str(tmp_path / "no-such-model")})
    _, raw = make_key(run)
    client = openai.OpenAI(base_url=f"{stack}/api/v1/runs/{run.pk}/openai/v1", api_key=raw, max_retries=0, timeout=300)
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model=f"run-{run.pk}", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert err.value.status_code == 502 and "rollout worker failed" in str(err.value.message), err.value
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_an_answer_that_takes_longer_than_a_socket_timeout_still_arrives(settings: Any) -> None:
    """redis-py stops reading a socket after 5 s (its default socket_timeout), also under a
    blocking pop: a generation that takes longer (a long queue) must still be waited for."""
    key = token_stream.reply_key_new()
    assert key is not None

    def later() -> None:
        time.sleep(6.5)
        token_stream.reply_push(key, {"model_version": 3})

    pusher = threading.Thread(target=later)
    pusher.start()
    try:
        assert asyncio.run(token_stream.reply_wait(key, timeout=30)) == {"model_version": 3}
    finally:
        pusher.join()


def test_no_answer_within_the_timeout_is_none() -> None:
    key = token_stream.reply_key_new()
    assert key is not None
    started = time.monotonic()
    assert asyncio.run(token_stream.reply_wait(key, timeout=0.3)) is None
    assert time.monotonic() - started < 3
