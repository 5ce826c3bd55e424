"""The review of labels over the REST API (mounted in rftweb/api.py under keys with the
`feedback` action): the same list, decisions and disagreements as the review page, through
the same services (apps.feedback.review.services). Reviewing is the run owner's: the key must have
been made by the run's owner (or staff), whose name the decisions are recorded under."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja import Router, Schema
from ninja.params.functions import Path, Query
from pydantic import Field

from apps.feedback.review.services import Resolution, ReviewOutcome, disagreement_resolve, feedback_accept, feedback_reject
from apps.feedback.review.selectors import (
    Disagreement,
    ReviewRow,
    disagreements,
    review_filters_parse,
    review_rows,
    who,
)
from apps.runs.api_kit import RunId, responses, run_reachable
from apps.runs.models import Run
from apps.runs.selectors import run_role
from kernel.exceptions import NotAllowed
from kernel.jsontypes import Body

router = Router(tags=["review"])

FeedbackId: int = Path(..., ge=1, le=2**63 - 1, description="the label's (feedback row's) id")


class LabelOut(Schema):
    id: int
    kind: str
    author: str = Field(description="who gave it: a username, or 'key <name>' for an environment's key")
    experience_id: int | None
    other_id: int | None
    group_id: str
    value: Body
    late: bool
    created_at: datetime
    review: str = Field(description="pending, accepted or rejected; a rejected label takes no effect")
    reviewed_by: str | None
    reviewed_at: datetime | None
    trained: bool = Field(description="its group was trained on (or it came late): a rejection leaves the reward it "
                                      "taught in the versions trained")
    disagreement: bool = Field(description="part of an open disagreement")
    correction: str | None = Field(None, description="a correction's text (its expert experience); null for other kinds")


class ReviewOut(Schema):
    label: LabelOut
    effect: str = Field(description="what the decision did, in words")


class ConflictOut(Schema):
    first: int
    second: int
    why: str


class DisagreementOut(Schema):
    group_id: str
    prompt: str
    labels: list[LabelOut]
    conflicts: list[ConflictOut]
    trained: bool


class KeepIn(Schema):
    keep: int = Field(ge=1, le=2**63 - 1, description="the id of the label whose side is kept; those against it are rejected")


class ResolutionOut(Schema):
    kept: ReviewOut
    rejected: list[ReviewOut]


def _owner_run(request: HttpRequest, run_id: int) -> tuple[Run, User]:
    """The run, and the key's person when they may review it (its owner or staff); NotAllowed otherwise."""
    run = run_reachable(request, run_id)
    person = getattr(getattr(getattr(request, "auth", None), "key", None), "created_by", None)
    if not isinstance(person, User) or run_role(run=run, user=person) != "owner":
        raise NotAllowed("reviewing labels takes a key made by the run's owner (or staff)", field="run_id")
    return run, person


def _label(row: ReviewRow) -> Body:
    f = row.feedback
    return {"id": f.pk, "kind": f.kind, "author": who(f), "experience_id": f.experience_id, "other_id": f.other_id,
            "group_id": f.group_id, "value": f.value, "late": f.late, "created_at": f.created_at, "review": f.review,
            "reviewed_by": f.reviewed_by.get_username() if f.reviewed_by else None, "reviewed_at": f.reviewed_at,
            "trained": row.trained, "disagreement": row.disagreement, "correction": row.correction}


def _outcome(outcome: ReviewOutcome, *, disputed: bool = False) -> Body:
    return {"label": _label(ReviewRow(feedback=outcome.feedback, trained=outcome.trained, disagreement=disputed)),
            "effect": outcome.effect}


def _disagreement(d: Disagreement) -> Body:
    return {"group_id": d.group_id, "prompt": d.prompt, "trained": d.trained,
            "labels": [_label(ReviewRow(feedback=f, trained=d.trained, disagreement=True)) for f in d.labels],
            "conflicts": [{"first": c.first, "second": c.second, "why": c.why} for c in d.conflicts]}


@router.get("/runs/{run_id}/review/labels", response=responses(list[LabelOut]),
            summary="The run's labels newest first, with their review state (the owner's key)")
def review_labels_list(
    request: HttpRequest, run_id: int = RunId,
    kind: str = Query("", max_length=40, description="one kind of label (rating, ranking, pairwise, edit, flag)"),
    person: str = Query("", max_length=150, description="a username, or 'key <name>'"),
    status: str = Query("", max_length=10, description="pending, accepted or rejected"),
    disagreements: bool = Query(False, description="only labels in an open disagreement"),
) -> list[Body]:
    run, _ = _owner_run(request, run_id)
    parsed = review_filters_parse({"kind": kind, "person": person, "status": status,
                                   "disagreements": "1" if disagreements else ""})
    return [_label(row) for row in review_rows(run=run, filters=parsed)]


@router.post("/runs/{run_id}/review/labels/{feedback_id}/accept", response=responses(ReviewOut),
             summary="Accept a label (recorded: who, when)")
def review_label_accept(request: HttpRequest, run_id: int = RunId, feedback_id: int = FeedbackId) -> Body:
    run, person = _owner_run(request, run_id)
    return _outcome(feedback_accept(run=run, feedback_id=feedback_id, reviewer=person))


@router.post("/runs/{run_id}/review/labels/{feedback_id}/reject", response=responses(ReviewOut),
             summary="Reject a label: it leaves its group's reward, the reward model's pairs and the exports")
def review_label_reject(request: HttpRequest, run_id: int = RunId, feedback_id: int = FeedbackId) -> Body:
    run, person = _owner_run(request, run_id)
    return _outcome(feedback_reject(run=run, feedback_id=feedback_id, reviewer=person))


@router.get("/runs/{run_id}/review/disagreements", response=responses(list[DisagreementOut]),
            summary="Items where people's labels conflict, open ones only")
def review_disagreements_list(request: HttpRequest, run_id: int = RunId) -> list[Body]:
    run, _ = _owner_run(request, run_id)
    return [_disagreement(d) for d in disagreements(run=run)]


@router.post("/runs/{run_id}/review/disagreements/{group_id}/resolve", response=responses(ResolutionOut, 409),
             summary="Resolve a disagreement by keeping one label's side (the labels against it are rejected)")
def review_disagreement_resolve(request: HttpRequest, payload: KeepIn, run_id: int = RunId,
                                group_id: str = Path(..., max_length=100)) -> Body:
    run, person = _owner_run(request, run_id)
    resolution: Resolution = disagreement_resolve(run=run, group_id=group_id, keep=payload.keep, reviewer=person)
    return {"kept": _outcome(resolution.kept), "rejected": [_outcome(o) for o in resolution.rejected]}

