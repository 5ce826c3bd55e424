"""The run's API key page: owners create (the key is shown once), list and revoke keys."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.envapi.forms import ApiKeyForm
from apps.envapi.models import ApiKey
from apps.envapi.selectors import api_keys_of_run
from apps.envapi.services import api_key_create, api_key_revoke
from apps.runs.models import Run
from apps.runs.selectors import run_role
from kernel.exceptions import RftError
from rftweb.exceptions import form_errors_add


def _owned_run(request: HttpRequest, run_id: int) -> Run:
    # As on the run pages: 404 for a run the user may not see (no hint that it exists),
    # 403 for its people who are not its owner.
    run = get_object_or_404(Run, pk=run_id)
    role = run_role(run=run, user=request.user)
    if role is None:
        raise Http404("no such run")
    if role != "owner":
        raise PermissionDenied("only the run's owner manages its API keys")
    return run


@login_required
def run_keys(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _owned_run(request, run_id)
    new_key: str | None = None
    form = ApiKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            _, new_key = api_key_create(
                name=form.cleaned_data["name"], runs=[run], actions=form.cleaned_data["actions"],
                rate_limit_per_minute=form.cleaned_data["rate_limit_per_minute"], created_by=request.user,
            )
        except RftError as exc:
            form_errors_add(form, exc)
        else:
            form = ApiKeyForm()
    status = 422 if request.method == "POST" and new_key is None else 200
    context = {"run": run, "form": form, "keys": api_keys_of_run(run=run), "new_key": new_key}
    # The raw key is in this one response only: never cached, never stored.
    response = render(request, "envapi/keys.html", context, status=status)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def run_key_revoke(request: HttpRequest, run_id: int, key_id: int) -> HttpResponse:
    run = _owned_run(request, run_id)
    key = get_object_or_404(ApiKey, pk=key_id, runs=run)
    api_key_revoke(key=key)
    messages.success(request, f"Revoked {key.name} ({key.prefix}…). It stops working now.")
    return redirect("envapi:run-keys", run_id=run.pk)
