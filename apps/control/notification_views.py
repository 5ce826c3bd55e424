"""The notifications page (a person's run-end notifications, mark read, email choices per
run) and the header badge's fragment."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.control.notifications import (
    notification_preference_set,
    notification_runs,
    notifications_for,
    notifications_mark_read,
)
from apps.runs.models import Run
from rftweb.http import signed_in


@login_required
@require_http_methods(["GET"])
def notification_list(request: HttpRequest) -> HttpResponse:
    runs = notification_runs(user=signed_in(request))
    return render(request, "accounts/notifications.html", {
        "notifications": notifications_for(user=signed_in(request)), "runs": runs,
        "emailed_runs": sum(1 for _, wanted in runs if wanted)})


@login_required
@require_POST
def notification_read(request: HttpRequest) -> HttpResponse:
    """Mark read the notification `id` of the person's own, or all of them without one."""
    raw = request.POST.get("id", "").strip()
    if raw and not raw.isdigit():
        messages.error(request, "id: not a notification number")
        return redirect("notifications")
    notifications_mark_read(user=signed_in(request), ids=[int(raw)] if raw else None)
    return redirect("notifications")


@login_required
@require_POST
def notification_email(request: HttpRequest, run_id: int) -> HttpResponse:
    """Turn the email on run `run_id`'s end on (`email=on`) or off."""
    run = get_object_or_404(Run, pk=run_id)
    try:
        notification_preference_set(run=run, user=signed_in(request), email=request.POST.get("email") == "on")
    except PermissionError:
        return HttpResponse("not your run", status=404)
    on = request.POST.get("email") == "on"
    messages.success(request, f"Email when “{run.name}” ends: {'on' if on else 'off'}.")
    if on and not signed_in(request).email:
        # Nothing would be sent: say so where it was turned on (issue 45 item 1).
        messages.warning(request, "No email address set — add one on your account page (your name at the top of the page): "
                                  "until then this email is not sent.")
    return redirect("notifications")


@login_required
@require_GET
def notification_badge(request: HttpRequest) -> HttpResponse:
    """The header's badge alone, for pages that refresh it live (the run page on a run's end)."""
    return render(request, "accounts/_badge.html")
