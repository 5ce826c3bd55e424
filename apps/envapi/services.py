"""Services of the environment API: keys, rate limits, tasks, trajectories, feedback, rollouts.

Keys look like `rft_<prefix>_<secret>`: the prefix finds the row, the sha256 of the whole
key is what is stored, and the comparison is constant-time. The secret is shown once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib.auth.models import User
from django.core.cache.backends.base import BaseCache
from django.db import transaction
from django.db.models import Max, Q, QuerySet
from django.utils import timezone

from apps.buffer.drafts import GROUP_MAX, KEY_MAX, ExperienceDraft
from apps.buffer.importers import ImportFailed, task_from_record
from apps.buffer.models import Experience, Task, TaskAttempt, Taskset
from apps.buffer.services import experience_write, task_attempts_create
from apps.envapi.models import ApiKey
from apps.rewards.scoring import rewards_unrouted_domains
from apps.runs.events import access_changed_publish
from apps.runs.invitations import Actor
from apps.runs.models import Run
from rftweb.degrade import REDIS_ERRORS, unavailable_message
from kernel.exceptions import InvalidInput, Unavailable, UpstreamFailed
from kernel.jsontypes import Body
from rftweb.celery import app

if TYPE_CHECKING:
    from celery.result import AsyncResult
    from redis import Redis

KEY_PREFIX = "rft_"
ACTIONS: tuple[str, ...] = ApiKey.ACTIONS
# last_used_at is a hint for people, not an audit log: writing it on every request would
# turn each read into a write.
_LAST_USED_EVERY = timedelta(seconds=60)


class KeyInvalid(InvalidInput):
    """Creating a key with bad arguments; `errors` maps field names to messages."""

    code = "key_invalid"

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(errors=errors)


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def api_key_create(
    *,
    name: str,
    runs: Iterable[Run],
    actions: Sequence[str],
    created_by: Actor = None,
    rate_limit_per_minute: int = 600,
) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the raw key, which is never stored or shown again."""
    runs = list(runs)
    errors: dict[str, str] = {}
    if not name.strip():
        errors["name"] = "a key needs a name"
    unknown = [a for a in actions if a not in ACTIONS]
    if unknown or not actions:
        errors["actions"] = f"choose one or more of {', '.join(ACTIONS)}" + (f" (unknown: {', '.join(unknown)})" if unknown else "")
    if not runs:
        errors["runs"] = "a key needs at least one run"
    if not isinstance(rate_limit_per_minute, int) or not 1 <= rate_limit_per_minute <= 1_000_000:
        errors["rate_limit_per_minute"] = "between 1 and 1000000 requests a minute"
    if errors:
        raise KeyInvalid(errors)
    prefix = secrets.token_hex(6)
    raw = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        key = ApiKey.objects.create(
            name=name.strip(),
            prefix=prefix,
            hashed=_hash(raw),
            actions=[a for a in ACTIONS if a in actions],
            rate_limit_per_minute=rate_limit_per_minute,
            created_by=created_by if isinstance(created_by, User) and created_by.is_authenticated else None,
        )
        key.runs.set(runs)
    return key, raw


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke at once (idempotent): the next request with it is refused, and its open event
    streams end (told through the access notice, apps.runs.events.access_changed_publish)."""
    ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    key.refresh_from_db(fields=["revoked_at"])
    access_changed_publish(key_id=key.pk)
    return key


def api_keys_live() -> QuerySet[ApiKey]:
    """The keys that work: not revoked, and made by no one (a command) or by a person whose
    account is active. A deactivated person's keys stop with their account, and work again
    if it is reactivated; the one rule every door that takes a key reads."""
    return ApiKey.objects.filter(revoked_at__isnull=True).filter(
        Q(created_by__isnull=True) | Q(created_by__is_active=True))


def api_keys_revoke_of(*, user_id: int) -> int:
    """Revoke every key `user_id` made (their account is being deleted: the key would
    otherwise outlive them as a key made by no one)."""
    ids = list(ApiKey.objects.filter(created_by_id=user_id, revoked_at__isnull=True).values_list("pk", flat=True))
    ApiKey.objects.filter(pk__in=ids).update(revoked_at=timezone.now())
    for key_id in ids:
        access_changed_publish(key_id=key_id)
    return len(ids)


@dataclass(frozen=True)
class KeyPrincipal:
    """What a request authenticated as: the key and the runs it may touch."""

    key: ApiKey
    run_ids: frozenset[int]

    def can(self, action: str) -> bool:
        return action in (self.key.actions or [])


def api_key_authenticate(*, raw: str | None) -> KeyPrincipal | None:
    """The live, unrevoked key for `raw`, or None. Reads the row every time, so a revoked
    key stops working on its next request."""
    if not raw or not raw.startswith(KEY_PREFIX) or len(raw) > 200:
        return None
    prefix, _, secret = raw[len(KEY_PREFIX):].partition("_")
    if not prefix or not secret:
        return None
    # The key and its runs in one query, a row per run: every call of the OpenAI endpoint
    # and the environment API authenticates, and a query costs the web process about a
    # millisecond of CPU, most of it Django building the SQL (bench/openai_endpoint).
    # `prefix` is unique: no ordering needed.
    scopes = list(ApiKey.runs.through.objects.filter(apikey__in=api_keys_live().filter(prefix=prefix))
                  .select_related("apikey"))
    if scopes:
        key: ApiKey | None = scopes[0].apikey
    else:  # no such key, or one whose runs were all deleted
        key = api_keys_live().filter(prefix=prefix).first()
    if key is None or not hmac.compare_digest(key.hashed, _hash(raw)):
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > _LAST_USED_EVERY:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return KeyPrincipal(key=key, run_ids=frozenset(s.run_id for s in scopes))


# ---------------------------------------------------------------------------------------
# Rate limits: a fixed one-minute window per key, counted in Django's cache (Redis when
# there is one, so every web process shares it; this process's memory in the embedded
# default, which has one process).
#
# Counted on one cache object per process, not `django.core.cache.cache`: under ASGI that is
# per asyncio context, so every request built a new RedisCache with a new connection pool and
# opened a new Redis connection, and `add` + `incr` cost three round trips (incr checks
# EXISTS first). That was the largest part of the OpenAI endpoint's own CPU per request
# (bench/openai_endpoint). On Redis the window is now one pipelined round trip.

_counter: tuple[object, BaseCache, Redis | None] | None = None  # (settings.CACHES["default"], cache, redis client or None)


def _counter_cache() -> tuple[BaseCache, Redis | None]:
    """(the process's cache object for counters, its Redis client or None); remade when the
    CACHES setting changes (tests override it)."""
    global _counter
    from django.conf import settings
    from django.core.cache import DEFAULT_CACHE_ALIAS, caches
    from django.core.cache.backends.redis import RedisCache

    config = settings.CACHES[DEFAULT_CACHE_ALIAS]
    if _counter is None or _counter[0] is not config:
        made = caches.create_connection(DEFAULT_CACHE_ALIAS)
        # One client on the cache's own pool (RedisCache makes a new client object per call).
        client = made._cache.get_client(write=True) if isinstance(made, RedisCache) else None
        _counter = (config, made, client)
    return _counter[1], _counter[2]


def rate_limit_hit(*, key: ApiKey, now: float | None = None) -> float | None:
    """Count one request for `key`; None when allowed, else seconds until the window ends."""
    now = time.time() if now is None else now
    window = int(now // 60)
    retry_after = 60 - (now % 60)
    name = f"envapi:rate:{key.pk}:{window}"
    counters, client = _counter_cache()
    if client is not None:
        full = counters.make_and_validate_key(name)
        pipe = client.pipeline(transaction=False)
        pipe.set(full, 0, ex=120, nx=True)  # the window's counter, unless another request made it
        pipe.incr(full)
        try:
            count = int(pipe.execute()[1])
        except REDIS_ERRORS as exc:
            # Fail closed: a request that cannot be counted is not served (503, Retry-After).
            raise Unavailable(unavailable_message("Redis (the API's rate limiter)")) from exc
    else:
        counters.add(name, 0, timeout=120)
        try:
            count = counters.incr(name)
        except ValueError:  # expired between the two calls (a window two minutes old): start over
            counters.add(name, 1, timeout=120)
            count = 1
    return None if count <= key.rate_limit_per_minute else max(retry_after, 0.001)


# ---------------------------------------------------------------------------------------
# Tasks


def tasks_add(*, run: Run, records: Sequence[Mapping[str, object]], owner: User | None = None) -> list[Task]:
    """Append tasks to the run's taskset (one is made for a run without one), all or none.

    When the run has already queued an epoch, the new tasks join its latest epoch, so an
    environment that adds tasks can claim them at once.
    """
    rows = [task_from_record(r, where=f"tasks.{i}") for i, r in enumerate(records)]
    if not rows:
        raise ImportFailed("tasks: give at least one task")
    for i, row in enumerate(rows):
        # A task no reward term of the run scores would train on nothing: refused, named.
        if rewards_unrouted_domains(terms=run.cfg.rewards, domains=[row["domain"]]):
            raise ImportFailed(f"tasks.{i}.domain: no reward term of this run scores domain {row['domain']!r}",
                               field=f"tasks.{i}.domain")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.taskset_id is None:
            taskset = Taskset.objects.create(name=f"{run.name} (API)", owner=owner or run.owner, source="api")
            Run.objects.filter(pk=run.pk).update(taskset=taskset)
            run.taskset = taskset
        else:
            # Lock the taskset row so two concurrent adds do not pick the same indexes.
            taskset = Taskset.objects.select_for_update().get(pk=locked.taskset_id)
        start = (Task.objects.filter(taskset=taskset).aggregate(m=Max("index"))["m"] or -1) + 1
        tasks = Task.objects.bulk_create([Task(taskset=taskset, index=start + i, **row) for i, row in enumerate(rows)])
        latest = TaskAttempt.objects.filter(run=run).order_by("-epoch").values_list("epoch", flat=True).first()
        if latest is not None:
            task_attempts_create(run=run, epoch=latest)
    return tasks


# ---------------------------------------------------------------------------------------
# Trajectories


ENV_NAMESPACE = "env:"


def env_scoped(value: str, *, limit: int) -> str:
    """A client's key or group id as stored: under `env:`, so an environment can never
    claim an explorer's idempotency key (`explore:…`) or join one of its GRPO groups
    (`attempt-…`); hashed when the prefixed name would not fit its column."""
    scoped = f"{ENV_NAMESPACE}{value}"
    if len(scoped) <= limit:
        return scoped
    return f"{ENV_NAMESPACE}sha256:{hashlib.sha256(value.encode()).hexdigest()}"[:limit]


def _stored_key(client_key: str) -> str:
    return env_scoped(str(client_key), limit=KEY_MAX)


def _trajectory_draft(run: Run, item: Mapping[str, Any], *, key: str, key_prefix: str) -> ExperienceDraft:
    messages = item.get("messages")
    prompt = item.get("prompt") or ""
    response = item.get("response") or ""
    if messages and not prompt:
        prompt = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") != "assistant")[:20000]
    if messages and not response:
        response = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "assistant"), "")
    metadata = dict(item.get("metadata") or {})
    metadata["api_key"] = key_prefix
    # Without a reward it waits (pending) for the environment's env_reward or a person's.
    return ExperienceDraft.scored(
        cfg=run.cfg,
        auto_reward=item.get("reward"),
        run_id=run.pk,
        key=key,
        group_id=env_scoped(str(item.get("group_id") or item["key"]), limit=GROUP_MAX),
        task_id=item.get("task_id"),
        source=Experience.Source.ENV,
        prompt_text=prompt,
        response_text=response,
        messages=messages,
        token_ids=item.get("token_ids") or [],
        prompt_length=item.get("prompt_length") or 0,
        logprobs=item.get("logprobs"),
        action_mask=item.get("action_mask"),
        finish_reason=item.get("finish_reason") or "",
        reward_parts=dict(item.get("reward_parts") or {}),
        model_version=run.current_version if item.get("model_version") is None else item["model_version"],
        metadata=metadata,
    )


@dataclass(frozen=True)
class SubmitResult:
    created: int
    duplicates: int
    # key -> (experience id, was it already there)
    items: list[tuple[str, int, bool]]


def trajectories_submit(*, run: Run, trajectories: Sequence[Mapping[str, Any]], key_prefix: str) -> SubmitResult:
    """Write environment trajectories as experiences, idempotent on each client key, and
    announce the new ones.

    Raises InvalidInput naming `trajectories.<row>[.<field>]` (nothing written) for a
    malformed one or a task outside the run's taskset.
    """
    task_ids = {t["task_id"] for t in trajectories if t.get("task_id") is not None}
    if task_ids:
        known = set(Task.objects.filter(pk__in=task_ids, taskset_id=run.taskset_id).values_list("pk", flat=True)) if run.taskset_id else set()
        for i, t in enumerate(trajectories):
            if t.get("task_id") is not None and t["task_id"] not in known:
                raise InvalidInput(f"task {t['task_id']} is not in this run's taskset", field=f"trajectories.{i}.task_id")
    drafts = []
    for i, t in enumerate(trajectories):
        try:
            # Answers speak the client's keys; the buffer stores them scoped (see env_scoped).
            drafts.append(_trajectory_draft(run, t, key=_stored_key(t["key"]), key_prefix=key_prefix))
        except InvalidInput as exc:
            raise exc.within(f"trajectories.{i}") from None
    try:
        result = experience_write(experiences=drafts, announce=True)
    except InvalidInput as exc:
        raise exc.within("trajectories") from None
    items = [(str(t["key"]), pk, not new) for t, pk, new in zip(trajectories, result.ids, result.is_new, strict=True)]
    return SubmitResult(created=result.created, duplicates=result.duplicates, items=items)


# ---------------------------------------------------------------------------------------
# Rollouts

GENERATE_TASK = "workers.explore.explorer.generate"
_START_ONE = "start a worker on the 'rollout' queue or try again"


def rollout_task_send(*, task: str, args: list[object], timeout: float, hint: str = "", ignore_result: bool = False) -> AsyncResult:
    """Send one task to the `rollout` queue (its AsyncResult); Unavailable when the broker is
    unreachable. `ignore_result`: the answer comes back another way (the OpenAI endpoint's
    reply list), so the worker stores nothing in the result backend."""
    from kombu.exceptions import OperationalError


    try:
        # expires: a request nobody picked up in time is dropped, not generated for nobody.
        # argsrepr: Celery would otherwise walk the whole request (every message of every
        # prompt) to build a depth-limited repr for the headers: ~3% of the OpenAI endpoint's
        # CPU per call in a profile (bench/openai_endpoint), for a log line nobody reads.
        return app.send_task(task, args=args, queue="rollout", expires=timeout, ignore_result=ignore_result,
                             argsrepr=f"[{args[0]!r}, …]" if args else "[]", kwargsrepr="{}")
    except OperationalError as exc:
        raise Unavailable(f"the task broker is unreachable ({exc}){hint}") from None


def rollout_task_wait(*, task: str, args: list[object], timeout: float, hint: str = "") -> object:
    """Send one task to the `rollout` queue and wait for its answer: Unavailable when no broker
    or no worker answers in time (`hint` says what to do), UpstreamFailed when the worker
    raised. The environment API's rollouts and the OpenAI endpoint both call it."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    result = rollout_task_send(task=task, args=args, timeout=timeout, hint=hint)
    try:
        return result.get(timeout=timeout, propagate=True, disable_sync_subtasks=False)
    except CeleryTimeout:
        result.revoke()
        # Stop waiting on it: the backend kept it pending, and its Redis subscription, for the
        # life of the web process (one more for every request no worker answered).
        result.backend.remove_pending_result(result)
        raise Unavailable(f"no rollout worker answered within {timeout:g} s{hint}") from None
    except Exception as exc:  # the worker's exception, re-raised by Celery
        raise UpstreamFailed(f"the rollout worker failed: {type(exc).__name__}: {exc}") from None


class RolloutAnswer(TypedDict):
    """One request's answer: its prompt's tokens, the model version, and its completions
    (text, token_ids, logprobs, finish_reason)."""

    prompt_token_ids: list[int]
    model_version: int
    completions: list[Body]


def rollouts_generate(*, run: Run, requests: list[Body], timeout: float) -> list[RolloutAnswer]:
    """Generate with the run's current model on a `rollout` worker and wait for the answer.

    Contract with the explorer: `workers.explore.explorer.generate(run_id, requests)` returns one
    dict per completion, in request order: {"request", "index", "text", "token_ids",
    "prompt_token_ids", "logprobs", "finish_reason", "model_version"}; the answer here is one
    dict per request: {"prompt_token_ids", "model_version", "completions": [...]}.
    """
    answer = rollout_task_wait(task=GENERATE_TASK, args=[run.pk, requests], timeout=timeout, hint=f"; {_START_ONE}")
    return _rollouts_by_request(answer, count=len(requests))


def _rollouts_by_request(answer: object, *, count: int) -> list[RolloutAnswer]:
    """The explorer answers with one flat entry per completion, tagged with its request
    index; the API answers per request."""
    if not isinstance(answer, list) or not all(isinstance(c, dict) and isinstance(c.get("request"), int) for c in answer):
        raise UpstreamFailed("the rollout worker returned a malformed result")
    grouped: list[RolloutAnswer] = [{"prompt_token_ids": [], "model_version": 0, "completions": []} for _ in range(count)]
    for c in sorted(answer, key=lambda c: (c["request"], c.get("index", 0))):
        if not 0 <= c["request"] < count:
            raise UpstreamFailed("the rollout worker returned a completion for an unknown request")
        entry = grouped[c["request"]]
        entry["prompt_token_ids"] = c.get("prompt_token_ids", [])
        entry["model_version"] = c.get("model_version", 0)
        entry["completions"].append(
            {k: c.get(k) for k in ("text", "token_ids", "logprobs", "finish_reason")}
        )
    if any(not entry["completions"] for entry in grouped):
        raise UpstreamFailed("the rollout worker returned no completion for a request")
    return grouped
