"""The environment API's router (runs, tasks, trajectories, feedback, rollouts, events,
exports): thin handlers over `apps.envapi.services`, mounted with the other apps' routers on
the one NinjaAPI of `/api/v1/` (rftweb/api.py, which also translates the errors).

Authentication: `Authorization: Bearer rft_…`. Scopes: `read` (runs, events), `submit`
(tasks, rollouts, trajectories), `feedback` (feedback). Errors are `{"detail", "errors"}`
with 401 (no or bad key), 403 (an action outside the key's scopes), 404 (unknown ids, and
runs outside the key's runs: the same answer, so run ids cannot be probed), 413 (body past
RFT_MAX_BODY_BYTES), 422 (field path -> message), 429 (over the key's rate, with
Retry-After), 503 (no rollout worker answered). None of them writes anything.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Annotated

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Router
from ninja.params.functions import Path, Query
from ninja.security import HttpBearer
from pydantic import ValidationError as PydanticValidationError

from apps.buffer.models import Experience
from apps.buffer.services import task_claim, task_finish, task_release
from apps.envapi import schemas as s
from apps.envapi.selectors import TasksetImportOut, run_current_version, run_taskset_import
from apps.envapi.services import (
    KeyPrincipal,
    api_key_authenticate,
    api_keys_live,
    rate_limit_hit,
    rollouts_generate,
    tasks_add,
    trajectories_submit,
)
from apps.feedback.bulk import bulk_allowed, bulk_ids, experiences_bulk, experiences_export
from apps.feedback.training_data import export_jsonl_response, export_options_parse
from apps.feedback.kinds import KindApiIn, Who, kind_get
from apps.feedback.ledger import label_state, run_ledger
from apps.feedback.models import Feedback
from apps.feedback.handout.queue import annotation_waiting
from apps.feedback.selectors import feedback_counts, feedback_effect, run_may_annotate
from apps.runs.api_kit import ERRORS, RunId, responses, run_reachable, run_scope_check
from apps.runs.events import ACCESS_STREAM, ACCESS_NOTICE, layer_events, run_stream_name
from apps.runs.models import Run
from apps.runs.selectors import eval_basis, eval_best, eval_measures, metric_moves, run_takes_feedback
from kernel.exceptions import NotAllowed, NotFound, RateLimited, UpstreamFailed
from kernel.jsontypes import Body

router = Router()
FeedbackId: int = Path(..., ge=1, le=2**63 - 1, description="the feedback row's id")


# ---- auth ----------------------------------------------------------------------------


class KeyAuth(HttpBearer):
    """A bearer API key that holds `action`, under the key's rate limit."""

    def __init__(self, action: str) -> None:
        self.action = action
        super().__init__()

    def authenticate(self, request: HttpRequest, token: str) -> KeyPrincipal | None:
        principal = api_key_authenticate(raw=token)
        if principal is None:
            return None
        run_scope_check(request, principal)
        if not principal.can(self.action):
            raise NotAllowed(f"this key may not {self.action} (it may: {', '.join(principal.key.actions) or 'nothing'})")
        wait = rate_limit_hit(key=principal.key)
        if wait is not None:
            raise RateLimited(f"over this key's limit of {principal.key.rate_limit_per_minute} requests a minute",
                              retry_after=wait)
        return principal


READ, SUBMIT, FEEDBACK = KeyAuth("read"), KeyAuth("submit"), KeyAuth("feedback")



def _principal(request: HttpRequest) -> KeyPrincipal:
    principal = getattr(request, "auth", None)  # set by the routes' key auth (KeyAuth)
    if not isinstance(principal, KeyPrincipal):
        raise TypeError("the environment API's routes authenticate with a key")
    return principal


def _worker(request: HttpRequest, label: str) -> str:
    return f"key:{_principal(request).key.prefix}:{label}"[:200]


# ---- runs ----------------------------------------------------------------------------


def _run_out(run: Run) -> Body:
    return {
        "id": run.pk, "name": run.name, "status": run.status, "config": run.cfg, "taskset_id": run.taskset_id,
        "current_version": run_current_version(run=run), "explore_step": run.explore_step,
        "train_step": run.train_step, "created_at": run.created_at, "takes_feedback": run_takes_feedback(run=run),
    }


@router.get("/runs", auth=READ, response=responses(list[s.RunOut]), tags=["runs"], summary="Runs this key may see")
def runs_list(request: HttpRequest) -> list[Body]:
    runs = Run.objects.filter(pk__in=_principal(request).run_ids).order_by("-created_at")
    return [_run_out(run) for run in runs]


@router.get("/runs/{run_id}", auth=READ, response=responses(s.RunOut), tags=["runs"],
         summary="A run, with its current model version and checkpoint")
def run_get(request: HttpRequest, run_id: int = RunId) -> Body:
    return _run_out(run_reachable(request, run_id))


@router.get("/runs/{run_id}/taskset", auth=READ, response=responses(s.TasksetOut), tags=["runs"],
         summary="The run's taskset and its import progress (large uploads import in the background)")
def run_taskset_get(request: HttpRequest, run_id: int = RunId) -> TasksetImportOut:
    found = run_taskset_import(run=run_reachable(request, run_id))
    if found is None:
        raise NotFound("this run has no taskset", field="taskset")
    return found


# ---- tasks ---------------------------------------------------------------------------


@router.post("/runs/{run_id}/tasks/claim", auth=SUBMIT, response=responses(s.TaskClaimOut), tags=["tasks"],
          summary="Lease a batch of the run's tasks")
def tasks_claim(request: HttpRequest, payload: s.TaskClaimIn, run_id: int = RunId) -> Body:
    run = run_reachable(request, run_id)
    worker = _worker(request, payload.worker)
    attempts = task_claim(run=run, worker=worker, size=payload.size, lease_seconds=payload.lease_seconds)
    return {
        "worker": payload.worker,
        "lease_expires_at": attempts[0].lease_expires_at if attempts else None,
        "tasks": [
            {"attempt_id": a.pk, "task_id": a.task_id, "epoch": a.epoch, "prompt": a.task.prompt,
             "messages": a.task.messages, "reference": a.task.reference, "domain": a.task.domain,
             "metadata": a.task.metadata or {}}
            for a in attempts
        ],
    }


@router.post("/runs/{run_id}/tasks/release", auth=SUBMIT, response=responses(s.CountOut), tags=["tasks"],
          summary="Hand leased tasks back to the queue")
def tasks_release(request: HttpRequest, payload: s.TaskReleaseIn, run_id: int = RunId) -> dict[str, int]:
    run = run_reachable(request, run_id)
    n = task_release(run=run, worker=_worker(request, payload.worker), ids=payload.attempt_ids)
    return {"count": n}


@router.post("/runs/{run_id}/tasks/finish", auth=SUBMIT, response=responses(s.CountOut), tags=["tasks"],
          summary="Mark leased tasks done")
def tasks_finish(request: HttpRequest, payload: s.TaskFinishIn, run_id: int = RunId) -> dict[str, int]:
    run = run_reachable(request, run_id)
    version = run.current_version if payload.model_version is None else payload.model_version
    n = task_finish(run=run, worker=_worker(request, payload.worker), ids=payload.attempt_ids, model_version=version)
    return {"count": n}


@router.post("/runs/{run_id}/tasks", auth=SUBMIT, response=responses(s.TasksAddOut), tags=["tasks"],
          summary="Add tasks to the run's taskset")
def tasks_create(request: HttpRequest, payload: s.TasksAddIn, run_id: int = RunId) -> Body:
    run = run_reachable(request, run_id)
    tasks = tasks_add(run=run, records=[t.model_dump() for t in payload.tasks])
    return {"taskset_id": tasks[0].taskset_id, "task_ids": [t.pk for t in tasks]}


# ---- trajectories --------------------------------------------------------------------


@router.post("/runs/{run_id}/trajectories", auth=SUBMIT, response=responses(s.TrajectoriesOut), tags=["trajectories"],
          summary="Submit trajectories as experiences (idempotent on each key)")
def trajectories_create(request: HttpRequest, payload: s.TrajectoriesIn, run_id: int = RunId) -> Body:
    run = run_reachable(request, run_id)
    items = [t.model_dump(exclude_none=False) for t in payload.trajectories]
    for item, t in zip(items, payload.trajectories, strict=True):
        if t.messages is not None:
            item["messages"] = [m.model_dump(exclude_none=True) for m in t.messages]
    result = trajectories_submit(run=run, trajectories=items, key_prefix=_principal(request).key.prefix)
    return {
        "created": result.created,
        "duplicates": result.duplicates,
        "results": [{"key": k, "id": pk, "duplicate": dup} for k, pk, dup in result.items],
    }


# ---- feedback ------------------------------------------------------------------------


@router.post("/runs/{run_id}/feedback", auth=FEEDBACK, response=responses(s.FeedbackOut), tags=["feedback"],
          summary="A reward, rating, ranking, preference or flag")
def feedback_create(request: HttpRequest, payload: Annotated[KindApiIn, s.FeedbackIn], run_id: int = RunId) -> Body:
    run = run_reachable(request, run_id)
    who: Who = {"run": run, "api_key": _principal(request).key, "comment": payload.comment}
    feedback: Feedback
    # Each kind's body requires experience_id but a group's (KindApiIn's validator).
    experience = payload.experience_id or 0
    feedback = kind_get(payload.kind).api_store(payload, experience=experience, who=who)
    return _feedback_out(run, feedback)


def _feedback_out(run: Run, feedback: Feedback) -> Body:
    target: Mapping[str, object] = {}
    if feedback.experience_id is not None:
        target = Experience.objects.filter(pk=feedback.experience_id).values("status", "reward").first() or {}
    state = label_state(feedback=feedback)
    return {
        "id": feedback.pk, "kind": feedback.kind, "experience_id": feedback.experience_id,
        "group_id": feedback.group_id, "late": feedback.late, "value": feedback.value,
        "effect": feedback_effect(run=run, feedback=feedback),
        "experience_status": target.get("status"), "experience_reward": target.get("reward"),
        "state": state.as_dict() if state is not None else None,
    }


@router.get("/runs/{run_id}/feedback/{feedback_id}", auth=READ, response=responses(s.FeedbackOut),
         tags=["feedback"], summary="One piece of feedback, and where the label stands now (trained, …)")
def feedback_get(request: HttpRequest, run_id: int = RunId, feedback_id: int = FeedbackId) -> Body:
    run = run_reachable(request, run_id)
    feedback = Feedback.objects.filter(run=run, pk=feedback_id).first()
    if feedback is None:
        raise NotFound(f"run {run.pk} has no feedback {feedback_id}", field="feedback_id")
    return _feedback_out(run, feedback)


@router.get("/runs/{run_id}/labels", auth=READ, response=responses(s.RunLedgerOut), tags=["feedback"],
         summary="Where the run's labels went: trained, taught the reward model, pending, unused (why); per person")
def run_labels_ledger(request: HttpRequest, run_id: int = RunId) -> dict[str, object]:
    return run_ledger(run=run_reachable(request, run_id)).as_dict()


@router.get("/runs/{run_id}/evaluation", auth=READ, response=responses(s.EvaluationOut), tags=["runs"],
         summary="The held-out evaluation's series (start, end, best) and the best version with what chose it")
def run_evaluation(request: HttpRequest, run_id: int = RunId) -> dict[str, object]:
    run = run_reachable(request, run_id)
    moves = metric_moves(run=run, metrics=eval_measures(run=run))
    best = eval_best(run=run)
    basis = eval_basis(run=run)
    ev = run.cfg.eval
    return {
        "series": [{"name": m.name, "label": m.label, "start": m.start, "end": m.end, "best": m.best,
                    "best_step": m.best_step, "points": m.points, "start_step": m.start_step, "end_step": m.end_step,
                    "start_tasks": m.start_tasks, "end_tasks": m.end_tasks,
                    "start_interval": list(m.start_interval) if m.start_interval else None,
                    "end_interval": list(m.end_interval) if m.end_interval else None,
                    "change_interval": list(m.change_interval) if m.change_interval else None,
                    "change_words": m.change_words} for m in moves],
        "tasks": basis["tasks"] if basis else None, "samples": ev.n, "greedy": ev.sampling.temperature == 0,
        "temperature": ev.sampling.temperature, "basis": basis["words"] if basis else None,
        "best_version": best["version"] if best else None, "best_by": best["metric"] if best else None,
        "best_by_label": best["label"] if best else None, "best_value": best["value"] if best else None,
    }


@router.post("/runs/{run_id}/experiences/bulk", auth=FEEDBACK, response=responses(s.BulkOut), tags=["feedback"],
             summary="A bulk action over experiences: exclude from training, include again, flag, or export (JSONL)")
def experiences_bulk_api(request: HttpRequest, payload: s.BulkIn, run_id: int = RunId) -> dict[str, object] | StreamingHttpResponse:
    """As the key's person, with their role on the run: exclude and include are the owner's,
    flag an annotator's too, export anyone's on the run. Export answers JSONL, the rows."""
    run = run_reachable(request, run_id)
    person = _principal(request).key.created_by
    if person is None:
        raise NotAllowed("this key has no person to act as", field="action")
    bulk_allowed(run=run, user=person, action=payload.action)
    ids = bulk_ids(run=run, ids=payload.ids)
    if payload.action == "export":
        response = StreamingHttpResponse(experiences_export(run=run, user=person, ids=ids),
                                         content_type="application/jsonl; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-experiences-{len(ids)}.jsonl"'
        return response
    result = experiences_bulk(run=run, user=person, action=payload.action, ids=ids, reason=payload.reason)
    return {"action": result.action, "count": result.count, "skipped": result.skipped, "why_skipped": result.why_skipped}


@router.get("/runs/{run_id}/annotation", auth=READ, response=responses(s.AnnotationOut), tags=["feedback"],
            summary="What waits for the key's person on the run's annotation page")
def annotation_get(request: HttpRequest, run_id: int = RunId) -> dict[str, int | str]:
    run = run_reachable(request, run_id)
    person = _principal(request).key.created_by
    if person is None or not run_may_annotate(run=run, user=person):
        raise NotAllowed("this key's person does not annotate this run (the key has no person, or they are not "
                         "its owner or one of its annotators)", field="run_id")
    counts = feedback_counts(run=run)
    return {"annotator": person.get_username(), "waiting": annotation_waiting(run=run, annotator=person),
            "ratings": counts["rating"], "late": counts["late"]}


# ---- rollouts ------------------------------------------------------------------------


def _sampling_request(req: s.RolloutRequestIn) -> Body:
    data = req.model_dump(exclude_none=True)
    if req.messages is not None:
        data["messages"] = [m.model_dump(exclude_none=True) for m in req.messages]
    return data


@router.post("/runs/{run_id}/rollouts", auth=SUBMIT, response=responses(s.RolloutsOut, 502, 503), tags=["rollouts"],
          summary="Generate with the run's current model (token ids and logprobs included)")
async def rollouts_create(request: HttpRequest, payload: s.RolloutsIn, run_id: int = RunId) -> Body:
    run = await sync_to_async(run_reachable)(request, run_id)
    timeout = min(payload.timeout_seconds, settings.RFT_ROLLOUT_TIMEOUT_SECONDS)
    requests = [_sampling_request(r) for r in payload.requests]
    # Off the shared sync thread: waiting for a worker must not stall every other request.
    answer = await sync_to_async(rollouts_generate, thread_sensitive=False)(run=run, requests=requests, timeout=timeout)
    try:
        results = [s.RolloutOut.model_validate(item) for item in answer]
    except PydanticValidationError as exc:
        raise UpstreamFailed(f"the rollout worker returned a malformed result ({exc.error_count()} errors)") from None
    return {"results": results}


# ---- events --------------------------------------------------------------------------

_SSE_DOC = {
    "responses": {
        "200": {
            "description": "text/event-stream: `event: <type>` and `data: <json payload>` per run event; "
                           "comment lines keep the connection alive",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    }
}


async def _key_live(key_id: int) -> bool:
    return await api_keys_live().filter(pk=key_id).aexists()


# How often an open event stream re-reads whether its key still may read (beside the access
# notices, which end it at once), and how long a quiet one goes before a keep-alive comment.
ACCESS_RECHECK_SECONDS = 5.0
KEEP_ALIVE_SECONDS = 15.0


def _access_notice_concerns(message: Mapping[str, object], key_id: int, creator_id: int | None) -> bool:
    """Whether an access notice (apps.runs.events.access_changed_publish) may be about this key."""
    return (message.get("key") == key_id or (creator_id is not None and message.get("user") == creator_id)
            or (message.get("key") is None and message.get("user") is None))


async def _event_stream(run_id: int, key_id: int, creator_id: int | None, max_seconds: float,
                        max_events: int | None) -> AsyncIterator[str]:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    channel = await layer.new_channel()
    stream = run_stream_name(run_id)
    await layer.group_add(stream, channel)
    # The access notices too: a revoked key, or its maker deactivated, ends the stream at once.
    await layer.group_add(ACCESS_STREAM, channel)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_seconds
    checked = spoke = time.monotonic()
    sent = 0
    receiving: asyncio.Future[dict[str, object]] | None = None
    try:
        # Tells the client the subscription is live: events published from now on arrive.
        yield f": subscribed to run {run_id}\nretry: 3000\n\n"
        while (remaining := deadline - loop.time()) > 0:
            # One receive at a time, kept across the rechecks rather than cancelled at each (a
            # receive cancelled while it takes a message may lose it).
            if receiving is None:
                receiving = asyncio.ensure_future(layer.receive(channel))
            done, _ = await asyncio.wait({receiving}, timeout=min(ACCESS_RECHECK_SECONDS, remaining))
            message = None
            if done:
                message, receiving = receiving.result(), None
            notice = message is not None and message.get("type") == ACCESS_NOTICE
            # Also re-read every ACCESS_RECHECK_SECONDS, quiet or not: a notice lost (with Redis,
            # or never delivered: CI once saw a deactivation end the stream only at the 15 s
            # keep-alive) ends the stream that much later, not never and not a keep-alive later.
            recheck = (time.monotonic() - checked >= ACCESS_RECHECK_SECONDS
                       or (notice and message is not None
                           and _access_notice_concerns(message, key_id, creator_id)))
            if recheck and not await _key_live(key_id):
                yield "event: error\ndata: {\"detail\": \"the API key was revoked, or its maker's account deactivated\"}\n\n"
                return
            if recheck:
                checked = time.monotonic()
            if message is None:
                if time.monotonic() - spoke >= KEEP_ALIVE_SECONDS:
                    spoke = time.monotonic()
                    yield ": keep-alive\n\n"
                continue
            if notice:
                continue
            for event in layer_events(message):
                sent += 1
                data = json.dumps(event["payload"], separators=(",", ":"), default=str)
                yield f"id: {sent}\nevent: {event['type']}\ndata: {data}\n\n"
                spoke = time.monotonic()
                if max_events is not None and sent >= max_events:
                    return
    finally:
        if receiving is not None:
            receiving.cancel()
        await layer.group_discard(stream, channel)
        await layer.group_discard(ACCESS_STREAM, channel)


@router.get("/runs/{run_id}/events", auth=READ, response={k: v for k, v in ERRORS.items() if k not in (413,)},
         tags=["events"], summary="The run's live events (server-sent events)", openapi_extra=_SSE_DOC)
async def run_events(
    request: HttpRequest,
    run_id: int = RunId,
    max_seconds: float = Query(3600.0, gt=0, le=86400, description="end the stream after this long"),
    max_events: int | None = Query(None, ge=1, le=1_000_000, description="end the stream after this many events"),
) -> StreamingHttpResponse:
    run = await sync_to_async(run_reachable)(request, run_id)
    key = _principal(request).key
    stream = _event_stream(run.pk, key.pk, key.created_by_id, max_seconds, max_events)
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


# ---- exports --------------------------------------------------------------------------

_JSONL_DOC = {
    "responses": {
        "200": {
            "description": "JSON lines in the format TRL's trainers read (the run page's export, the same bytes)",
            "content": {"application/jsonl": {"schema": {"type": "string"}}},
        }
    }
}


@router.get("/runs/{run_id}/export/{format}.jsonl", auth=READ, response=ERRORS, tags=["exports"],
         summary="The run's data as TRL reads it: sft, dpo, grpo or preferences", openapi_extra=_JSONL_DOC)
def run_export(
    request: HttpRequest,
    run_id: int = RunId,
    format: str = Path(..., description="the export's format: sft, dpo, grpo or preferences"),  # the wire's name
    min_reward: str | None = Query(None, description="only experiences with at least this reward"),
    min_version: str | None = Query(None, description="only experiences of this model version or later"),
    min_margin: str | None = Query(None, description="dpo: chosen beats rejected by more than this"),
    domain: str | None = Query(None, description="only tasks of this domain"),
) -> StreamingHttpResponse:
    run = run_reachable(request, run_id)
    options = export_options_parse({"min_reward": min_reward, "min_version": min_version, "min_margin": min_margin,
                                    "domain": domain})
    return export_jsonl_response(run=run, export_format=format, options=options)
