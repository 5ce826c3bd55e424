"""`POST /api/v1/runs/{run_id}/sessions/{name}/finish`: an agent session's reward, which turns
its recorded calls into experiences (apps/envapi/agent_sessions.py). Mounted on the one API
with the `submit` keys in rftweb/api.py."""

from __future__ import annotations

from typing import Annotated

from django.http import HttpRequest
from ninja import Field, Router, Schema
from ninja.params.functions import Path

from apps.envapi import agent_sessions
from apps.runs.api_kit import responses, run_reachable
from kernel.jsontypes import Body


class SessionFinishIn(Schema):
    reward: float = Field(..., allow_inf_nan=False, description="the session's reward")
    reward_parts: Annotated[dict[Annotated[str, Field(min_length=1, max_length=100)], Annotated[float, Field(allow_inf_nan=False)]],
                            Field(max_length=64)] = Field(default_factory=dict)


class SessionSplit(Schema):
    call: int
    reason: str


class SessionFinishOut(Schema):
    session: str
    status: str
    experience_ids: list[int]
    turns: int
    splits: list[SessionSplit]
    created: bool = Field(description="false: the session was already finished; nothing changed")


router = Router(tags=["sessions"])


@router.post("/runs/{run_id}/sessions/{name}/finish", response=responses(SessionFinishOut, 409),
             summary="Finish an agent session: its calls become one multi-turn experience")
def session_finish(request: HttpRequest, payload: SessionFinishIn,
                   run_id: int = Path(..., ge=1, le=2**63 - 1),
                   name: str = Path(..., min_length=1, max_length=200)) -> Body:
    run = run_reachable(request, run_id)
    # A missing session is NotFound, one that cannot finish SessionRejected (a Conflict): the
    # API's one translation of RftError answers them.
    result = agent_sessions.session_finish(run=run, name=name, reward=payload.reward,
                                           reward_parts=payload.reward_parts,
                                           key_prefix=request.auth.key.prefix)  # type: ignore[attr-defined]
    return {"session": name, "status": result.session.status, "experience_ids": result.experience_ids,
            "turns": int(result.session.assembly.get("calls", 0)), "splits": result.splits, "created": result.created}
