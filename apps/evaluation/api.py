"""Blind evaluations over the REST API (mounted in rftweb/api.py): ask for one, the next pair
for the key's person, vote, close, the figures and the votes as JSON lines. The person is the
key's maker; a key of a run its maker can no longer see votes nowhere (404, like a missing run).
The next pair names no version: only its opaque token and the two texts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime

from django.contrib.auth.models import User
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Router, Schema
from ninja.params.functions import Path
from pydantic import Field

from apps.evaluation.models import Evaluation, Vote
from apps.evaluation.selectors import evaluation_figures, labels, next_item, progress_of, run_evaluations, votes_export
from apps.evaluation.services import (
    COMMENT_MAX,
    PROMPTS_MAX,
    VOTES_PER_PAIR_MAX,
    VersionRef,
    evaluation_close,
    evaluation_create,
    voter_check,
    vote_cast,
)
from apps.runs.api_kit import ERRORS, RunId, responses, run_reachable
from apps.runs.models import Run
from apps.runs.selectors import run_role
from kernel.exceptions import NotAllowed, NotFound
from kernel.jsontypes import Body
from kernel.pairwise_stats import Figures, Interval

# One router (mounted under keys with `read`): what a person does (ask, vote, close) also
# needs the key's `feedback` action. One router, because two routers' routes on one path
# would hide each other's methods.
router = Router(tags=["evaluations"])

EvaluationId: int = Path(..., ge=1, le=2**63 - 1, description="the evaluation's id")


class VersionIn(Schema):
    version: int = Field(ge=0, le=2**31 - 1, description="a published version's number (0: the starting model)")
    run: int | None = Field(None, ge=1, le=2**63 - 1, description="another run's id (one the key's person can see); "
                                                                  "blank: this run")


class EvaluationIn(Schema):
    versions: list[VersionIn] | None = Field(None, max_length=8, description="two or more; the first is the "
                                             "baseline. Blank: version 0 against the newest")
    prompts: list[str] | None = Field(None, max_length=PROMPTS_MAX, description="prompts to use; blank: drawn from "
                                      "the run's evaluation taskset (held out from training)")
    prompt_count: int = Field(20, ge=1, le=PROMPTS_MAX)
    votes_per_pair: int = Field(1, ge=1, le=VOTES_PER_PAIR_MAX)
    voters: list[str] | None = Field(None, max_length=200, description="usernames; blank: the run's owner and annotators")
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="recorded; blank: drawn")
    placement: str = Field("page", max_length=16, description="page: on the vote page of its own; between: also "
                           "between the items of the run's annotation page")


class BlindEvaluationOut(Schema):
    id: int
    status: str = Field(description="generating (the workers write the answers), open or closed")
    versions: list[str]
    seed: int
    prompts: int
    votes_per_pair: int
    placement: str = Field(description="page (the vote page of its own) or between (also between annotation items)")
    items: int
    votes: int
    created_at: datetime
    error: str


class ProgressOut(Schema):
    done: int
    total: int


class ItemOut(Schema):
    token: str = Field(description="the pair's opaque name: vote with it")
    prompt: str
    a: str = Field(description="the answer shown first (left)")
    b: str = Field(description="the answer shown second (right)")


class NextOut(Schema):
    item: ItemOut | None = Field(description="null: nothing left for you")
    progress: ProgressOut


class VoteIn(Schema):
    token: str = Field(min_length=1, max_length=64)
    choice: str = Field(description="a (left), b (right), tie or both_bad")
    comment: str = Field("", max_length=COMMENT_MAX)


class VoteOut(Schema):
    ok: bool


class IntervalOut(Schema):
    low: float
    high: float


class WinRateOut(Schema):
    version: str
    baseline: str
    votes: int
    wins: float = Field(description="wins, ties and both-bad counting half")
    rate: float
    interval: IntervalOut = Field(description="95% Wilson score interval")
    verdict: str = Field(description="better than the baseline, worse than the baseline, or too few votes to tell")
    votes_for_margin: int = Field(description="the votes a ±0.1 interval needs at this rate")


class ScoreOut(Schema):
    version: str
    score: float = Field(description="Bradley–Terry log-strength over the baseline's")
    interval: IntervalOut = Field(description="95% bootstrap interval (seeded by the evaluation's seed)")


class BlindAgreementOut(Schema):
    voter: str
    compared: int
    agreed: int
    share: float | None


class CheckFlagOut(Schema):
    voter: str
    checks: int
    sided: int = Field(description="planted checks (the same answer twice) on which they picked a side")
    flagged: bool


class FiguresOut(Schema):
    evaluation: int
    versions: list[str]
    votes: int
    checks: int
    win_rates: list[WinRateOut]
    scores: list[ScoreOut]
    both_bad_share: float | None
    left_share: float | None = Field(description="position bias: the share of decisive votes the left side won")
    left_interval: IntervalOut | None
    decisive: int
    agreement: list[BlindAgreementOut]
    check_flags: list[CheckFlagOut]


def _person(request: HttpRequest) -> User:
    """The key's maker, when the key may act (`feedback`)."""
    principal = getattr(request, "auth", None)
    if principal is None or not principal.can("feedback"):
        raise NotAllowed("this takes a key with the feedback action")
    person = getattr(getattr(principal, "key", None), "created_by", None)
    if not isinstance(person, User):
        raise NotAllowed("this takes a key made by a person")
    return person


def _evaluation(request: HttpRequest, run_id: int, evaluation_id: int) -> Evaluation:
    run = run_reachable(request, run_id)
    evaluation = Evaluation.objects.select_related("run").filter(pk=evaluation_id, run=run).first()
    if evaluation is None:
        raise NotFound(f"evaluation {evaluation_id} not found", field="evaluation_id")
    return evaluation


def _out(evaluation: Evaluation) -> Body:
    return {"id": evaluation.pk, "status": evaluation.status, "versions": labels(evaluation), "seed": evaluation.seed,
            "prompts": evaluation.prompts.count(), "votes_per_pair": evaluation.votes_per_pair,
            "placement": evaluation.placement, "items": evaluation.items.count(), "votes": Vote.objects.filter(item__evaluation=evaluation).count(),
            "created_at": evaluation.created_at, "error": evaluation.error}


def _interval(i: Interval) -> Body:
    return {"low": i.low, "high": i.high}


def figures_body(evaluation: Evaluation, fig: Figures) -> Body:
    """The figures as the API, the CLI and the pages read them."""
    return {
        "evaluation": evaluation.pk, "versions": labels(evaluation), "votes": fig.votes, "checks": fig.checks,
        "win_rates": [{"version": w.version, "baseline": w.baseline, "votes": w.votes, "wins": w.wins, "rate": w.rate,
                       "interval": _interval(w.interval), "verdict": w.verdict,
                       "votes_for_margin": w.votes_for_margin} for w in fig.win_rates],
        "scores": [{"version": s.version, "score": s.score, "interval": _interval(s.interval)} for s in fig.scores],
        "both_bad_share": fig.both_bad_share, "left_share": fig.left_share,
        "left_interval": _interval(fig.left_interval) if fig.left_interval else None, "decisive": fig.decisive,
        "agreement": [{"voter": a.voter, "compared": a.compared, "agreed": a.agreed, "share": a.share}
                      for a in fig.agreement],
        "check_flags": [{"voter": c.voter, "checks": c.checks, "sided": c.sided, "flagged": c.flagged}
                        for c in fig.check_flags],
    }


CHOICES_IN = {"a": "left", "b": "right", "left": "left", "right": "right", "tie": "tie", "both_bad": "both_bad"}


@router.post("/runs/{run_id}/evaluations", response=responses(BlindEvaluationOut, 409),
           summary="Ask for a blind evaluation (the run owner's key)")
def evaluation_create_api(request: HttpRequest, payload: EvaluationIn, run_id: int = RunId) -> Body:
    run: Run = run_reachable(request, run_id)
    versions = [VersionRef(number=v.version, run_id=v.run) for v in payload.versions] if payload.versions else None
    evaluation = evaluation_create(run=run, by=_person(request), versions=versions, prompts=payload.prompts,
                                   prompt_count=payload.prompt_count, votes_per_pair=payload.votes_per_pair,
                                   voters=payload.voters, seed=payload.seed, placement=payload.placement)
    return _out(evaluation)


@router.get("/runs/{run_id}/evaluations", response=responses(list[BlindEvaluationOut]),
           summary="The run's blind evaluations, newest first")
def evaluations_list_api(request: HttpRequest, run_id: int = RunId) -> list[Body]:
    return [_out(e) for e in run_evaluations(run=run_reachable(request, run_id))[:100]]


@router.get("/runs/{run_id}/evaluations/{evaluation_id}/next", response=responses(NextOut, 409),
          summary="The next pair for the key's person (no version named)")
def evaluation_next_api(request: HttpRequest, run_id: int = RunId, evaluation_id: int = EvaluationId) -> Body:
    evaluation = _evaluation(request, run_id, evaluation_id)
    person = _person(request)
    voter_check(evaluation=evaluation, user=person)
    shown = next_item(evaluation=evaluation, user=person) if evaluation.status == Evaluation.Status.OPEN else None
    if shown is None:
        p = progress_of(evaluation=evaluation, user=person)
        return {"item": None, "progress": {"done": p.done, "total": p.total}}
    return {"item": {"token": shown.token, "prompt": shown.prompt, "a": shown.a, "b": shown.b},
            "progress": {"done": shown.progress.done, "total": shown.progress.total}}


@router.post("/runs/{run_id}/evaluations/{evaluation_id}/votes", response=responses(VoteOut, 409),
           summary="Vote on a pair: a, b, tie or both_bad")
def evaluation_vote_api(request: HttpRequest, payload: VoteIn, run_id: int = RunId,
                        evaluation_id: int = EvaluationId) -> Body:
    evaluation = _evaluation(request, run_id, evaluation_id)
    vote_cast(evaluation=evaluation, token=payload.token, voter=_person(request),
              choice=CHOICES_IN.get(payload.choice, payload.choice), comment=payload.comment)
    return {"ok": True}


@router.post("/runs/{run_id}/evaluations/{evaluation_id}/close", response=responses(BlindEvaluationOut, 409),
           summary="Close an evaluation to votes (the run owner's key)")
def evaluation_close_api(request: HttpRequest, run_id: int = RunId, evaluation_id: int = EvaluationId) -> Body:
    return _out(evaluation_close(evaluation=_evaluation(request, run_id, evaluation_id), by=_person(request)))


@router.get("/runs/{run_id}/evaluations/{evaluation_id}/figures", response=responses(FiguresOut),
           summary="Win rates with 95% intervals, Bradley–Terry scores, both-bad share, position bias, agreement")
def evaluation_figures_api(request: HttpRequest, run_id: int = RunId, evaluation_id: int = EvaluationId) -> Body:
    evaluation = _evaluation(request, run_id, evaluation_id)
    return figures_body(evaluation, evaluation_figures(evaluation))


def _lines(evaluation: Evaluation) -> Iterator[str]:
    for record in votes_export(evaluation):
        yield json.dumps(record, ensure_ascii=False) + "\n"


@router.get("/runs/{run_id}/evaluations/{evaluation_id}/votes.jsonl", response=ERRORS,
           summary="The evaluation's votes, one JSON object a line (versions named; the owner's key)",
           openapi_extra={"responses": {"200": {"description": "JSON lines",
                                                "content": {"application/jsonl": {"schema": {"type": "string"}}}}}})
def evaluation_export_api(request: HttpRequest, run_id: int = RunId,
                          evaluation_id: int = EvaluationId) -> StreamingHttpResponse:
    evaluation = _evaluation(request, run_id, evaluation_id)
    # Every person's choices, the versions named: the owner's, as on the run page.
    person = getattr(getattr(getattr(request, "auth", None), "key", None), "created_by", None)
    if not isinstance(person, User) or run_role(run=evaluation.run, user=person) != "owner":
        raise NotAllowed("the votes' export takes a key made by the run's owner (or staff)")
    response = StreamingHttpResponse(_lines(evaluation), content_type="application/jsonl; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="evaluation-{evaluation.pk}-votes.jsonl"'
    return response
