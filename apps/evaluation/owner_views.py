"""The run owner's side of blind evaluations on the run page: ask for one, close it, download
its votes (the same services as the REST API and `rft evaluation`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from apps.evaluation.models import Evaluation
from apps.evaluation.selectors import votes_export
from apps.evaluation.services import VersionRef, evaluation_close, evaluation_create
from apps.runs.access import run_for_page
from kernel.exceptions import InvalidInput
from rftweb.http import HtmxHttpRequest, refusals, refused_back_to, signed_in


def _back(run_id: int) -> HttpResponse:
    return redirect(_run_page_url(run_id))


def _run_page_url(run_id: int) -> str:
    return reverse("runs:detail", args=[run_id]) + "#blind-evaluations"


def _int(value: str, field: str, default: int) -> int:
    try:
        return int(value) if value.strip() else default
    except ValueError:
        raise InvalidInput(f"{field} must be a whole number", field=field) from None


def _versions(text: str) -> list[VersionRef] | None:
    refs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        run, _, number = part.rpartition(":")
        try:
            refs.append(VersionRef(number=int(number), run_id=int(run) if run else None))
        except ValueError:
            raise InvalidInput(f"versions: {part!r} is not N or RUN:N", field="versions") from None
    return refs or None


def _run_page(request: HtmxHttpRequest, run_id: int, **_: object) -> str:
    return _run_page_url(run_id)


@login_required
@require_POST
@refusals(refused_back_to(_run_page, prefix="No evaluation: "))
def evaluation_create_view(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    post = request.POST
    evaluation = evaluation_create(
        run=run, by=signed_in(request), versions=_versions(post.get("versions", "")),
        prompt_count=_int(post.get("prompt_count", ""), "prompt_count", 20),
        votes_per_pair=_int(post.get("votes_per_pair", ""), "votes_per_pair", 1),
        voters=[v.strip() for v in post.get("voters", "").split(",") if v.strip()] or None,
        placement=post.get("placement", "") or Evaluation.Placement.PAGE)
    messages.success(request, f"Blind evaluation #{evaluation.pk} asked for ({evaluation.status}).")
    return _back(run.pk)


def _evaluation(request: HtmxHttpRequest, run_id: int, evaluation_id: int) -> Evaluation:
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner")
    evaluation = Evaluation.objects.select_related("run").filter(pk=evaluation_id, run=run).first()
    if evaluation is None:
        raise Http404("no such evaluation")
    return evaluation


@login_required
@require_POST
@refusals(refused_back_to(_run_page))
def evaluation_close_view(request: HtmxHttpRequest, run_id: int, evaluation_id: int) -> HttpResponse:
    evaluation = _evaluation(request, run_id, evaluation_id)
    evaluation_close(evaluation=evaluation, by=signed_in(request))
    return _back(run_id)


def _lines(evaluation: Evaluation) -> Iterator[str]:
    for record in votes_export(evaluation):
        yield json.dumps(record, ensure_ascii=False) + "\n"


@login_required
@require_GET
def evaluation_export_view(request: HtmxHttpRequest, run_id: int, evaluation_id: int) -> StreamingHttpResponse:
    evaluation = _evaluation(request, run_id, evaluation_id)
    response = StreamingHttpResponse(_lines(evaluation), content_type="application/jsonl; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="evaluation-{evaluation.pk}-votes.jsonl"'
    return response
