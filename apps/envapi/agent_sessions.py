"""Agent sessions: calls through the OpenAI-compatible endpoint become training trajectories.

A call names its session with the `X-Rft-Session` header (or `metadata.rft_session`, or the
`user` field) and may name the task it works on (`X-Rft-Task` / `metadata.rft_task`, a task
id of the run's taskset). Each call is recorded exactly: the prompt's token ids as the
model saw them, every choice's sampled token ids and logprobs, the model version.

Finishing the session (`POST /api/v1/runs/<id>/sessions/<name>/finish` with the reward)
assembles the calls into one multi-turn experience: the tokens of the first prompt, then for
each turn the tokens the model sampled (action mask 1, their logprobs) and the tokens the
next prompt adds after them — the tool's answer, the user's next message, the template's
turn markers (mask 0, logprob 0 as a placeholder the trainer never reads). Nothing is
re-tokenised. Where a call's prompt does not start with exactly the tokens before it (the
client rewrote the history, the template re-rendered a turn differently, another choice of
an n > 1 call was kept), the trajectory is split there: each part becomes its own
experience with the same reward, and the session's `assembly` says where and why.

Sessions of one task share a GRPO group (`agent-task-<id>`); a session without a task is a
group of its own. A session with no call for RFT_AGENT_SESSION_TTL_SECONDS that was never
finished is marked abandoned and trains nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.buffer.drafts import ExperienceDraft, without_nul
from apps.buffer.models import Experience, Task
from apps.buffer.services import experience_write
from apps.envapi.models import AgentCall, AgentSession, ApiKey
from apps.envapi.openai_services import OpenAIError
from apps.buffer.drafts import GROUP_MAX, KEY_MAX
from apps.envapi.services import env_scoped
from apps.runs.models import Run
from kernel.exceptions import Conflict, NotFound

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Rft-Session"
TASK_HEADER = "X-Rft-Task"


class RecordedChoice(TypedDict):
    """A choice of a recorded call (AgentCall.choices): the exact tokens the model sampled."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str


class Split(TypedDict):
    """Where a session's trajectory was split: the call whose prompt broke the prefix, and why."""

    call: int
    reason: str


@dataclass(frozen=True)
class SessionRef:
    name: str
    task_id: int | None = None


def session_named(*, headers: Mapping[str, str], user: str | None, metadata: Mapping[str, str] | None) -> SessionRef | None:
    """The session a call names, if any: the header first, then metadata, then `user`."""
    meta = metadata or {}
    name = (headers.get(SESSION_HEADER) or meta.get("rft_session") or user or "").strip()
    if not name:
        return None
    if len(name) > 200:
        raise OpenAIError(400, "a session name is at most 200 characters", param=SESSION_HEADER, code="invalid_value")
    raw_task = (headers.get(TASK_HEADER) or meta.get("rft_task") or "").strip()
    task_id = None
    if raw_task:
        if not raw_task.isdigit() or not 0 < int(raw_task) < 2**63:
            raise OpenAIError(400, "the task must be a task id (a positive integer)", param=TASK_HEADER, code="invalid_value")
        task_id = int(raw_task)
    return SessionRef(name=name, task_id=task_id)


def session_check(*, run: Run, key: ApiKey, session: SessionRef) -> AgentSession:
    """The open session `session` names in `run`, made on its first call; OpenAIError for a
    session already finished or abandoned, or a task outside the run's taskset."""
    sessions_expire(run=run)
    task_id = session.task_id
    if task_id is not None and not Task.objects.filter(pk=task_id, taskset_id=run.taskset_id or 0).exists():
        raise OpenAIError(400, f"task {task_id} is not in this run's taskset", param=TASK_HEADER, code="invalid_value")
    row = AgentSession.objects.filter(run=run, name=session.name).first()
    if row is None:
        try:
            with transaction.atomic():
                row = AgentSession.objects.create(run=run, name=session.name, api_key=key, task_id=task_id)
        except IntegrityError:  # a concurrent first call made it
            row = AgentSession.objects.get(run=run, name=session.name)
    if row.status != AgentSession.Status.OPEN:
        raise OpenAIError(400, f"session {session.name!r} is {row.status}; start a new session", param=SESSION_HEADER,
                          code="session_closed")
    if task_id is not None and row.task_id not in (None, task_id):
        raise OpenAIError(400, f"session {session.name!r} works on task {row.task_id}, not {task_id}", param=TASK_HEADER,
                          code="invalid_value")
    if task_id is not None and row.task_id is None:
        AgentSession.objects.filter(pk=row.pk, task__isnull=True).update(task_id=task_id)
    return row


def call_record(*, run: Run, key: ApiKey, session: SessionRef, endpoint: str, answer: Mapping[str, Any]) -> AgentCall:
    """Keep one call's exact tokens: one AgentCall per prompt of the answer (a completions
    call with several prompts records each). `answer`: a WorkerAnswer, of which this reads the
    prompts' token ids and the choices' tokens, logprobs, finish reason and text."""
    row = session_check(run=run, key=key, session=session)
    version = int(answer["model_version"])
    with transaction.atomic():
        locked = AgentSession.objects.select_for_update().get(pk=row.pk)
        start = AgentCall.objects.filter(session=locked).count()
        calls = AgentCall.objects.bulk_create([
            AgentCall(
                session=locked, index=start + i, endpoint=endpoint, model_version=version,
                prompt_token_ids=list(p["prompt_token_ids"]),
                choices=[{"token_ids": list(c["token_ids"]), "logprobs": list(c["logprobs"]),
                          # Sampled text can decode to NUL, which Postgres's JSON refuses (a 500
                          # in the learning test's agent): kept as U+FFFD, as experiences keep it.
                          "finish_reason": c["finish_reason"], "text": without_nul(c.get("text", ""))}
                         for c in p["choices"]],
            )
            for i, p in enumerate(answer["prompts"])
        ])
        AgentSession.objects.filter(pk=locked.pk).update(last_call_at=timezone.now())
    return calls[-1]


def sessions_expire(*, run: Run | None = None, now: datetime | None = None) -> int:
    """Mark open sessions with no call for RFT_AGENT_SESSION_TTL_SECONDS abandoned; how many."""
    now = now or timezone.now()
    stale = AgentSession.objects.filter(
        status=AgentSession.Status.OPEN,
        last_call_at__lt=now - timedelta(seconds=settings.RFT_AGENT_SESSION_TTL_SECONDS),
    )
    if run is not None:
        stale = stale.filter(run=run)
    n = stale.update(status=AgentSession.Status.ABANDONED, finished_at=now)
    if n:
        log.info("agent sessions: %d abandoned (no call for %g s)", n, settings.RFT_AGENT_SESSION_TTL_SECONDS)
    return n


# ---- assembly --------------------------------------------------------------------------


@dataclass
class Segment:
    """One experience's worth of a session: a prompt and what followed it."""

    prompt: list[int]
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reason: str = ""

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.completion

    def sample(self, call: AgentCall, choice: RecordedChoice) -> None:
        ids = list(choice["token_ids"])
        self.completion += ids
        self.mask += [1] * len(ids)
        self.logprobs += [float(x) for x in choice["logprobs"]]
        self.versions.append(call.model_version)
        self.calls.append(call.index)
        self.texts.append(str(choice.get("text") or ""))
        self.finish_reason = str(choice.get("finish_reason") or "")


def _extends(prompt: Sequence[int], tokens: Sequence[int]) -> bool:
    return len(prompt) >= len(tokens) and list(prompt[: len(tokens)]) == list(tokens)


def session_assemble(calls: Sequence[AgentCall]) -> tuple[list[Segment], list[Split]]:
    """The session's calls as segments (one, unless a prompt broke the token prefix) and the
    notes on each split. A call with n > 1 choices continues with the choice the next call's
    prompt extends (the first choice for the last call)."""
    segments: list[Segment] = []
    splits: list[Split] = []
    current: Segment | None = None
    for pos, call in enumerate(calls):
        nxt = calls[pos + 1] if pos + 1 < len(calls) else None
        prompt = list(call.prompt_token_ids)
        if current is not None and _extends(prompt, current.tokens):
            added = prompt[len(current.tokens):]
            current.completion += added
            current.mask += [0] * len(added)
            current.logprobs += [0.0] * len(added)
        else:
            if current is not None:
                splits.append({"call": call.index, "reason": _why(prompt, current.tokens)})
                segments.append(current)
            current = Segment(prompt=prompt)
        choice = call.choices[0]
        if nxt is not None and len(call.choices) > 1:
            for candidate in call.choices:
                if _extends(list(nxt.prompt_token_ids), current.tokens + list(candidate["token_ids"])):
                    choice = candidate
                    break
        current.sample(call, choice)
    if current is not None:
        segments.append(current)
    return segments, splits


def _why(prompt: Sequence[int], before: Sequence[int]) -> str:
    same = 0
    for a, b in zip(prompt, before):
        if a != b:
            break
        same += 1
    if same == len(prompt):
        return f"the prompt ({len(prompt)} tokens) is shorter than the {len(before)} tokens before it"
    return f"the prompt differs from the tokens before it at token {same} of {len(before)}"


class SessionRejected(Conflict):
    """The session cannot be finished in the state it is in (abandoned, no call)."""

    code = "session_rejected"


@dataclass(frozen=True)
class FinishResult:
    session: AgentSession
    experience_ids: list[int]
    splits: list[Split]
    created: bool


def session_finish(*, run: Run, name: str, reward: float, reward_parts: Mapping[str, float] | None = None,
                   key_prefix: str = "") -> FinishResult:
    """Finish a session: its calls become experiences with `reward`. Idempotent: finishing a
    finished session again returns its experiences (the reward is not changed)."""
    sessions_expire(run=run)
    with transaction.atomic():
        session = AgentSession.objects.select_for_update().filter(run=run, name=name).first()
        if session is None:
            raise NotFound(f"session {name!r} not found in run {run.pk}")
        if session.status == AgentSession.Status.FINISHED:
            return FinishResult(session=session, experience_ids=list(session.experience_ids),
                                splits=list(session.assembly.get("splits", [])), created=False)
        if session.status == AgentSession.Status.ABANDONED:
            raise SessionRejected(f"session {name!r} was abandoned (no call for "
                                       f"{settings.RFT_AGENT_SESSION_TTL_SECONDS:g} s); it trains nothing")
        calls = list(session.calls.order_by("index"))
        if not calls:
            raise SessionRejected(f"session {name!r} has no recorded call")
        segments, splits = session_assemble(calls)
        drafts = [_draft(run=run, session=session, segment=s, part=i, parts=len(segments), reward=reward,
                         reward_parts=reward_parts or {}, splits=splits, key_prefix=key_prefix)
                  for i, s in enumerate(segments)]
        # announce: experience.created for each new one once this commits.
        result = experience_write(experiences=drafts, announce=True)
        ids = list(result.ids)
        session.status = AgentSession.Status.FINISHED
        session.reward = reward
        session.reward_parts = dict(reward_parts or {})
        session.experience_ids = ids
        session.assembly = {"segments": len(segments), "splits": splits, "calls": len(calls)}
        session.finished_at = timezone.now()
        session.save(update_fields=["status", "reward", "reward_parts", "experience_ids", "assembly", "finished_at"])
    return FinishResult(session=session, experience_ids=ids, splits=splits, created=True)


def _draft(*, run: Run, session: AgentSession, segment: Segment, part: int, parts: int, reward: float,
           reward_parts: Mapping[str, float], splits: list[Split], key_prefix: str) -> ExperienceDraft:
    group = f"agent-task-{session.task_id}" if session.task_id else f"agent-session-{session.name}"
    key = f"agent-session:{session.name}" + (f":part{part}" if parts > 1 else "")
    metadata: dict[str, object] = {
        "agent_session": session.name, "turns": len(segment.calls), "calls": segment.calls,
        "turn_versions": segment.versions, "api_key": key_prefix,
    }
    if parts > 1:
        metadata.update({"part": part, "parts": parts, "splits": splits})
    task = Task.objects.filter(pk=session.task_id).first() if session.task_id else None
    return ExperienceDraft.scored(
        cfg=run.cfg,
        auto_reward=reward,
        run_id=run.pk,
        key=env_scoped(key, limit=KEY_MAX),
        group_id=env_scoped(group, limit=GROUP_MAX),
        task_id=session.task_id,
        source=Experience.Source.ENV,
        prompt_text=(task.prompt if task is not None else "") or f"agent session {session.name}",
        response_text="\n".join(t for t in segment.texts if t),
        token_ids=segment.tokens,
        prompt_length=len(segment.prompt),
        logprobs=segment.logprobs,
        action_mask=segment.mask,
        finish_reason=segment.finish_reason[:20],
        reward_parts={k: float(v) for k, v in reward_parts.items()},
        # The oldest version that sampled a turn: staleness is judged by it.
        model_version=min(segment.versions),
        metadata=metadata,
    )
