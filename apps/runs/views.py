from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from apps.buffer.selectors import buffer_counts
from apps.runs.selectors import runs_visible_to


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    runs = list(runs_visible_to(user=request.user).select_related("owner"))
    rows = [{"run": run, "counts": buffer_counts(run=run)} for run in runs]
    return render(request, "runs/list.html", {"rows": rows})


def health(request: HttpRequest) -> JsonResponse:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
