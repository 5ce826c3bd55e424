"""The rollout worker's chat task (workers/explore/chat.py) in this process, on real Postgres: what it
reads from the database per call. The endpoint sends the run's config digest and current
version with each request (apps/envapi/openai_services.py), so a warm worker answers a call
without a query; an edited config, an unknown run or version still come out right."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.envapi.openai_services import completion_request_build, worker_request_build
from apps.envapi.openai_schemas import CompletionIn
from apps.runs.models import Run
from apps.runs.services import model_version_publish
from tests.factories import make_run
from workers.explore.chat import chat_generate

pytestmark = pytest.mark.django_db


def _request(run: Run, *, model: str | None = None, version: int | None = None, **body: Any) -> dict[str, Any]:
    """What the endpoint sends for a completion, built by the endpoint's own services."""
    req = CompletionIn.model_validate({"model": model or f"run-{run.pk}", "prompt": "What is 2 + 2?", **body})
    return worker_request_build(run=run, request=completion_request_build(req=req, version=version))


def _run(owner: User, model_dir: Path, **sampling: Any) -> Run:
    return make_run(owner=owner, model=str(model_dir), engine="transformers",
                    sampling={"temperature": 1.0, "max_tokens": 6, "seed": 0, **sampling})


def _tokens(answer: Mapping[str, Any]) -> list[int]:
    assert "error" not in answer, answer
    return list(answer["prompts"][0]["choices"][0]["token_ids"])


def test_a_second_call_reads_nothing_from_the_database(owner: User, demo_model_dir: Path, hf_engine: Any) -> None:
    run = _run(owner, demo_model_dir)
    first = chat_generate(run_id=run.pk, request=_request(run))
    with CaptureQueriesContext(connection) as queries:
        second = chat_generate(run_id=run.pk, request=_request(run))
    assert [q["sql"] for q in queries.captured_queries] == []
    assert first["model_version"] == second["model_version"] == 0
    assert 0 < len(_tokens(second)) <= 6


def test_a_published_version_is_read_once_then_served_without_queries(
    owner: User, demo_model_dir: Path, hf_engine: Any, tmp_path: Path
) -> None:
    from tests.workers.test_engines import perturbed_copy

    run = _run(owner, demo_model_dir)
    model_version_publish(run=run, number=1, checkpoint=str(perturbed_copy(demo_model_dir, tmp_path / "v1")), train_step=1)
    run.refresh_from_db()
    try:
        assert chat_generate(run_id=run.pk, request=_request(run))["model_version"] == 1
        with CaptureQueriesContext(connection) as queries:
            # "current" as the web side read it before the publish: the engine already holds
            # v1 of this run, so the call neither reads the run nor swaps back to v0.
            stale = _request(run) | {"current": 0}
            assert chat_generate(run_id=run.pk, request=stale)["model_version"] == 1
            assert chat_generate(run_id=run.pk, request=_request(run, model=f"run-{run.pk}@v1", version=1))["model_version"] == 1
        assert [q["sql"] for q in queries.captured_queries] == []
    finally:
        hf_engine.load(version=0, path=str(demo_model_dir))


def test_an_edited_config_is_read_again_on_the_next_call(owner: User, demo_model_dir: Path, hf_engine: Any) -> None:
    run = _run(owner, demo_model_dir, temperature=0.0, max_tokens=6)
    assert len(_tokens(chat_generate(run_id=run.pk, request=_request(run)))) == 6
    # An edit (as a feedback settings change writes one): the next call carries another digest.
    Run.objects.filter(pk=run.pk).update(config={**run.config, "sampling": {**run.config["sampling"], "max_tokens": 2}})
    run.refresh_from_db()
    assert len(_tokens(chat_generate(run_id=run.pk, request=_request(run)))) == 2
    with CaptureQueriesContext(connection) as queries:
        assert len(_tokens(chat_generate(run_id=run.pk, request=_request(run)))) == 2
    assert queries.captured_queries == []


def test_an_unknown_run_or_version_is_refused_as_model_not_found(owner: User, demo_model_dir: Path, hf_engine: Any) -> None:
    run = _run(owner, demo_model_dir)
    chat_generate(run_id=run.pk, request=_request(run))  # the run is kept now
    missing = chat_generate(run_id=run.pk, request=_request(run, model=f"run-{run.pk}@v7", version=7))
    assert missing["error"]["status"] == 404 and missing["error"]["code"] == "model_not_found"
    # A run this worker never saw (the endpoint refuses it first; the worker, asked anyway, too).
    unknown = chat_generate(run_id=10**9, request=_request(run))
    assert unknown["error"]["status"] == 404 and unknown["error"]["code"] == "model_not_found"


def _pieces_one_decode_at_a_time(tokenizer: Any, ids: list[int]) -> list[str]:
    """token_pieces as it was written first: one `decode` per prefix."""
    pieces, previous = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            pieces.append("")
            continue
        pieces.append(text[len(previous):])
        previous = text
    return pieces


def test_an_answers_token_texts_and_pieces_are_what_decoding_each_token_and_prefix_gives(demo_model_dir: Path) -> None:
    from workers.explore.chat import _decodes_plainly, token_pieces, token_texts
    from workers.engines.base import tokenizer_load

    tokenizer = tokenizer_load(str(demo_model_dir))
    assert _decodes_plainly(tokenizer)  # the demo tokenizer takes the one-call path
    # Multi-byte characters split across tokens, special tokens, and every id of the vocabulary.
    ids = list(tokenizer("7 × 6 = 42, héllo 世界 🙂", add_special_tokens=False)["input_ids"])
    ids += [tokenizer.eos_token_id, *ids[:3], *range(len(tokenizer))]
    assert token_texts(tokenizer, ids) == [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    assert token_pieces(tokenizer, ids) == _pieces_one_decode_at_a_time(tokenizer, ids)
    assert "".join(token_pieces(tokenizer, ids[:12])) == tokenizer.decode(ids[:12], skip_special_tokens=True)

    class Shouting(type(tokenizer)):  # type: ignore[misc]
        def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> Any:
            return super().decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs).upper()

    tokenizer.__class__ = Shouting  # a tokenizer with its own decode is asked, not bypassed
    assert not _decodes_plainly(tokenizer)
    assert token_texts(tokenizer, ids[:8]) == [tokenizer.decode([t]) for t in ids[:8]]


def test_a_call_with_a_reply_list_answers_there_and_leaves_the_task_result_empty(
    owner: User, demo_model_dir: Path, hf_engine: Any
) -> None:
    import asyncio

    from apps.envapi import token_stream
    from workers.explore.chat import chat

    key = token_stream.reply_key_new()
    if key is None:
        pytest.skip("replies need Redis")
    run = _run(owner, demo_model_dir)
    assert chat.apply(args=[run.pk, {**_request(run), "reply_key": key}]).get() is None
    answer = asyncio.run(token_stream.reply_wait(key, timeout=5))
    assert answer is not None and 0 < len(_tokens(answer)) <= 6
    again = chat.apply(args=[run.pk, _request(run)]).get()
    assert again is not None and _tokens(again) == _tokens(answer)  # seed 0
