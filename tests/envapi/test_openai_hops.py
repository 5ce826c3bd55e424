"""What an OpenAI-endpoint request costs the web process besides its own work: its views are
async, and each crossing between the event loop and a thread is CPU per request
(bench/openai_endpoint). The middleware chain runs in one thread, entered once: every
middleware can run synchronously, and the one that can only (rftweb.middleware) is the
innermost, so Django switches to a thread at the top and back at the view only."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from django.test import AsyncClient

from tests.envapi.conftest import make_key
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_listing_models_crosses_to_a_thread_once_for_the_whole_middleware_chain(owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(owner=owner, name="hops")
    _, raw = make_key(run)
    crossings: list[str] = []
    real_call = SyncToAsync.__call__

    async def counted(self: SyncToAsync, *args: Any, **kwargs: Any) -> Any:
        crossings.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await real_call(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)

    async def listing() -> Any:
        return await AsyncClient().get(f"/api/v1/runs/{run.pk}/openai/v1/models", headers={"authorization": f"Bearer {raw}"})

    response = asyncio.run(listing())
    assert response.status_code == 200 and response.json()["data"][0]["id"] == f"run-{run.pk}"
    # Django's own: the request_started signal, CSRF's view hook, closing the response; ours:
    # into the middleware chain's thread, and the key and run lookups on the database
    # threads. With a sync-only middleware in the middle of the chain, the ones inside it
    # ran each of their request and response hooks by a crossing of its own: eleven in all.
    assert len(crossings) <= 5, crossings
