"""The OpenAI-compatible endpoint of a run: `/api/v1/runs/<id>/openai/v1/…`.

Point any OpenAI client at `base_url=<site>/api/v1/runs/<id>/openai/v1` with one of the run's
API keys (the environment API's, made on the run's Keys page) as the api key:

- `POST chat/completions`: messages (tools and tool results too), n, temperature, top_p,
  max_tokens / max_completion_tokens, stop, seed, logprobs / top_logprobs, tools /
  tool_choice ("auto", "none"), stream (server-sent `chat.completion.chunk`s), usage;
- `POST completions`: a prompt (text, token ids, or a list of texts), the same sampling;
- `GET models`: `run-<id>` (the current version) and `run-<id>@v<N>` for each version.

Generation runs on the run's rollout workers (`workers/explore/chat.py`). With `stream: true` the
text goes out as the worker samples it (either engine; `apps/envapi/token_stream.py`),
holding back what may be a stop string or a tool call, which come from the whole answer at the
end with the finish reason; where the request asks for logprobs, or there is no Redis, the
chunks go out once the answer is whole, a token a chunk. Every refusal is OpenAI-shaped: `{"error": {"message", "type", "param",
"code"}}`, 400 for a bad request, 401 no or bad key, 403 a key without the `submit` action
(`read` or `submit` for models), 404 an unknown model or a run the key is not scoped to (the same
answer as for a missing run), 413, 429 (Retry-After),
502/503 when no rollout worker answers.

A call can name an agent session (header `X-Rft-Session`, or `metadata.rft_session`, or
`user`) and its task (`X-Rft-Task` / `metadata.rft_task`): see `apps/envapi/agent_sessions.py`.
"""

from __future__ import annotations

import asyncio
import logging
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from apps.envapi import openai_services as oa
from apps.envapi import token_stream
from apps.envapi.openai_schemas import ChatCompletionIn, CompletionIn
from apps.envapi.services import KeyPrincipal, api_key_authenticate, rate_limit_hit
from kernel.input_checks import InputRejected, tree_check
from apps.runs.models import Run
from rftweb.degrade import RETRY_AFTER_SECONDS
from kernel.exceptions import Unavailable, UpstreamFailed
from kernel.jsontypes import Body
from apps.envapi import agent_sessions

if TYPE_CHECKING:
    from apps.envapi.agent_sessions import SessionRef

log = logging.getLogger(__name__)

Schema = TypeVar("Schema", bound=BaseModel)
P = ParamSpec("P")
R = TypeVar("R")


def _error(exc: oa.OpenAIError) -> JsonResponse:
    response = JsonResponse(exc.body(), status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def _authorise(request: HttpRequest, run_id: int, *actions: str) -> tuple[Run, KeyPrincipal]:
    """The run and key of a request whose key holds one of `actions` for this run."""
    header = request.headers.get("Authorization", "")
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise oa.OpenAIError(401, "send the run's API key as 'Authorization: Bearer rft_…'", code="invalid_api_key",
                             headers={"WWW-Authenticate": "Bearer"})
    principal = api_key_authenticate(raw=raw.strip())
    if principal is None:
        raise oa.OpenAIError(401, "unknown or revoked API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    # A run outside the key's runs answers as a missing one (apps.runs.api_kit.run_reachable):
    # run ids cannot be probed.
    run: Run | None = None
    if run_id in principal.run_ids:
        try:
            # get, not filter().first(): no ordering for Django to build (CPU per request).
            run = Run.objects.get(pk=run_id)
        except Run.DoesNotExist:
            run = None
    if run is None:
        raise oa.OpenAIError(404, f"run {run_id} not found", code="not_found")
    if not any(principal.can(a) for a in actions):
        raise oa.OpenAIError(403, f"this key may not {' or '.join(actions)} (it may: {', '.join(principal.key.actions) or 'nothing'})",
                             code="permission_denied")
    try:
        wait = rate_limit_hit(key=principal.key)
    except Unavailable as exc:
        raise oa.OpenAIError(503, str(exc), code="service_unavailable",
                             headers={"Retry-After": str(math.ceil(exc.retry_after or RETRY_AFTER_SECONDS))}) from None
    if wait is not None:
        raise oa.OpenAIError(429, f"over this key's limit of {principal.key.rate_limit_per_minute} requests a minute",
                             code="rate_limit_exceeded", headers={"Retry-After": str(max(1, math.ceil(wait)))})
    return run, principal


def _parse(request: HttpRequest, schema: type[Schema]) -> Schema:
    if request.content_type and "json" not in request.content_type:
        raise oa.OpenAIError(400, "send the body as application/json", code="invalid_request")
    body = request.body
    if len(body) > settings.RFT_MAX_BODY_BYTES:
        raise oa.OpenAIError(413, f"the request body is larger than {settings.RFT_MAX_BODY_BYTES} bytes", code="request_too_large")
    try:
        data = json.loads(body, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(f"{name} is not a JSON number")))
    except (ValueError, RecursionError) as exc:
        raise oa.OpenAIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise oa.OpenAIError(400, "the body must be a JSON object", code="invalid_json")
    try:
        # NUL, lone surrogates, NaN: what Postgres cannot hold, refused as the environment API does.
        tree_check(data)
    except InputRejected as exc:
        raise oa.OpenAIError(400, f"{exc.field}: {exc.message}", param=exc.field, code="invalid_value") from None
    try:
        return schema.model_validate(data)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or None
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise oa.OpenAIError(400, f"{loc}: {message}" if loc else message, param=loc, code="invalid_value") from None


# The endpoint's database work (key, run, session, recording a call) runs on these few
# threads, each keeping its connection between requests. Run on a thread of the request's
# own (sync_to_async's default under ASGI), each call opened a new Postgres connection and
# closed it after: a backend started per request, ~30 ms wall and a few ms of CPU on a busy
# host, where 16 concurrent agents otherwise held 16-22 idle connections. A call here spends
# its time waiting for generation, not in the database, so a few threads serve many agents.
DB_THREADS = 4
_db_pool = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="openai-db")


def _connection_check() -> None:
    """What Django's per-request check does, minus the age limit: a connection that failed
    and is no longer usable is dropped (the next query opens a new one)."""
    if connection.connection is not None and connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()


def _in_thread(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`fn` run off the event loop with a database connection, on the endpoint's pool of
    threads."""

    def pooled(*args: P.args, **kwargs: P.kwargs) -> R:
        _connection_check()
        return fn(*args, **kwargs)

    return sync_to_async(pooled, thread_sensitive=False, executor=_db_pool)


def _prepare(request: HttpRequest, run_id: int, endpoint: str) -> tuple[
        Run, KeyPrincipal, ChatCompletionIn | CompletionIn, int | None, SessionRef | None]:
    """Everything before generation, in one trip to the database: key, body, model, session."""
    run, principal = _authorise(request, run_id, "submit")
    req: ChatCompletionIn | CompletionIn = (
        _parse(request, ChatCompletionIn) if endpoint == "chat" else _parse(request, CompletionIn))
    version = oa.model_resolve(run=run, name=req.model)
    session = agent_sessions.session_named(headers=request.headers, user=req.user, metadata=req.metadata)
    if session is not None:
        agent_sessions.session_check(run=run, key=principal.key, session=session)
    return run, principal, req, version, session


def _timeout() -> float:
    return float(settings.RFT_ROLLOUT_TIMEOUT_SECONDS)


async def _generate(run: Run, request: Body) -> oa.WorkerAnswer:
    try:
        if settings.REDIS_URL:
            # The answer comes back on a Redis list this loop waits on (token_stream.py).
            return await oa.openai_generate_replied(run=run, request=request, timeout=_timeout())
        # Off the shared sync thread: waiting for a worker must not stall other requests.
        return await sync_to_async(oa.openai_generate, thread_sensitive=False)(run=run, request=request, timeout=_timeout())
    except Unavailable as exc:
        raise oa.OpenAIError(503, f"{exc}; start a worker on the 'rollout' queue or try again", code="engine_unavailable",
                             headers={"Retry-After": "5"}) from None
    except UpstreamFailed as exc:
        raise oa.OpenAIError(502, str(exc), code="engine_error") from None


def _sse(chunks: Iterator[Body]) -> StreamingHttpResponse:
    async def stream() -> AsyncIterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk, separators=(',', ':'), ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _serve(request: HttpRequest, run_id: int, endpoint: str) -> HttpResponseBase:
    try:
        if request.method != "POST":
            raise oa.OpenAIError(405, "use POST", code="method_not_allowed")
        run, principal, req, version, session = await _in_thread(_prepare)(request, run_id, endpoint)
        # The request's type follows the endpoint (_prepare): a chat request for "chat".
        body = (oa.chat_request_build(req=req, version=version) if isinstance(req, ChatCompletionIn)
                else oa.completion_request_build(req=req, version=version))

        async def answer_recorded() -> oa.WorkerAnswer:
            answer = await _generate(run, body)
            if session is not None:
                await _in_thread(agent_sessions.call_record)(run=run, key=principal.key, session=session, endpoint=endpoint,
                                                             answer=answer)
            return answer

        key = token_stream.stream_key_new() if oa.live_streamable(req) else None
        if key is not None:
            body["stream_key"] = key
            live = await _live(endpoint=endpoint, req=req, run=run, job=asyncio.ensure_future(answer_recorded()), key=key,
                               version=run.current_version if version is None else version)
            if isinstance(live, StreamingHttpResponse):
                return live
            answer = live
        else:
            answer = await answer_recorded()
    except oa.OpenAIError as exc:
        return _error(exc)
    env = oa.envelope(endpoint=endpoint, model=req.model, run=run, version=int(answer["model_version"]))
    if isinstance(req, ChatCompletionIn):
        if req.stream:
            return _sse(oa.chat_chunks(req=req, answer=answer, env=env))
        return JsonResponse(oa.chat_body(req=req, answer=answer, env=env))
    if req.stream:
        return _sse(oa.completion_chunks(req=req, answer=answer, env=env))
    return JsonResponse(oa.completion_body(req=req, answer=answer, env=env))


async def _live(*, endpoint: str, req: ChatCompletionIn | CompletionIn, run: Run, job: asyncio.Future[oa.WorkerAnswer], key: str,
                version: int) -> StreamingHttpResponse | oa.WorkerAnswer:
    """Token-by-token streaming: a StreamingHttpResponse once the worker has started
    generating (its first event), or the answer itself when the job ends first (a refusal,
    which raises here as a 4xx; an engine that cannot stream; a short answer)."""
    # The job records the session's call even if the client goes away mid-stream.
    job.add_done_callback(lambda f: f.cancelled() or f.exception())
    reader = token_stream.StreamReader(key)
    first: dict[str, object] | None = None
    try:
        while True:
            first = await reader.next(timeout=0.5)
            if first is not None or job.done():
                break
    except Exception:
        # Redis went away under us: the answer still comes through Celery, whole.
        log.warning("token stream %s unreadable; streaming the whole answer", key, exc_info=True)
        first = None
    except BaseException:
        await _quietly(reader.close())
        raise
    if first is None:
        await _quietly(reader.close())
        return await job
    return _sse_async(_live_chunks(endpoint=endpoint, req=req, run=run, job=job, reader=reader, first=first, version=version))


async def _quietly(close: Awaitable[object]) -> None:
    try:
        await close
    except Exception:
        log.warning("token stream: could not clean up", exc_info=True)


async def _live_chunks(*, endpoint: str, req: ChatCompletionIn | CompletionIn, run: Run, job: asyncio.Future[oa.WorkerAnswer],
                       reader: token_stream.StreamReader, first: dict[str, object], version: int) -> AsyncIterator[Body]:
    # The version asked for (the worker read the current one a moment later: the tail says which answered).
    env = oa.envelope(endpoint=endpoint, model=req.model, run=run, version=version)
    texts = [oa.LiveText(oa.live_markers(req)) for _ in range(req.n)]
    try:
        if isinstance(req, ChatCompletionIn):  # endpoint "chat"
            for chunk in oa.chat_live_head(req=req, env=env):
                yield chunk
        event: dict[str, object] | None = first
        while True:
            if event is None:
                try:
                    # Once the answer is in, what was pushed before it; else wait for more.
                    event = await reader.next(timeout=0 if job.done() else 0.5)
                except Exception:
                    # Redis went away: the rest of the text comes from the answer below.
                    log.warning("token stream unreadable mid-stream; finishing from the answer", exc_info=True)
                    break
                if event is None:
                    if job.done():
                        break
                    continue
            if event.get("t") == "end":
                break
            pieces = event.get("p") or []
            for i, piece in enumerate(pieces if isinstance(pieces, list) else []):
                text = texts[i].add(str(piece)) if i < len(texts) else ""
                if text:
                    yield (oa.chat_live_piece(req=req, env=env, index=i, text=text) if isinstance(req, ChatCompletionIn)
                           else oa.completion_live_piece(env=env, index=i, text=text))
            event = None
        try:
            answer = await asyncio.shield(job)
        except oa.OpenAIError as exc:
            yield exc.body()
            return
        # The version that really answered (a new one may have been published meanwhile).
        env = oa.Envelope(id=env.id, created=env.created, model=env.model,
                          fingerprint=f"rft-run{run.pk}-v{int(answer['model_version'])}")
        tail = (oa.chat_live_tail(req=req, answer=answer, env=env, live=texts) if isinstance(req, ChatCompletionIn)
                else oa.completion_live_tail(req=req, answer=answer, env=env, live=texts))
        for chunk in tail:
            yield chunk
    finally:
        await _quietly(reader.close())


def _sse_async(chunks: AsyncIterator[Body]) -> StreamingHttpResponse:
    async def stream() -> AsyncIterator[str]:
        failed = False
        async for chunk in chunks:
            failed = failed or "error" in chunk
            yield f"data: {json.dumps(chunk, separators=(',', ':'), ensure_ascii=False)}\n\n"
        if not failed:
            yield "data: [DONE]\n\n"

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@csrf_exempt
async def chat_completions(request: HttpRequest, run_id: int) -> HttpResponseBase:
    return await _serve(request, run_id, "chat")


@csrf_exempt
async def completions(request: HttpRequest, run_id: int) -> HttpResponseBase:
    return await _serve(request, run_id, "completion")


@csrf_exempt
async def models(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        if request.method != "GET":
            raise oa.OpenAIError(405, "use GET", code="method_not_allowed")

        def listing() -> Body:
            run, _ = _authorise(request, run_id, "read", "submit")
            return oa.models_list(run=run)

        return JsonResponse(await _in_thread(listing)())
    except oa.OpenAIError as exc:
        return _error(exc)


@csrf_exempt
async def not_found(request: HttpRequest, run_id: int, rest: str) -> HttpResponse:
    return _error(oa.OpenAIError(404, f"no such endpoint: /v1/{rest}", code="not_found"))


urlpatterns = [
    path("chat/completions", chat_completions, name="openai-chat"),
    path("completions", completions, name="openai-completions"),
    path("models", models, name="openai-models"),
    path("<path:rest>", not_found),
]
