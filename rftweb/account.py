"""A person's own account page (issue 45 item 1): the email address run-end notifications go
to, a link to change the password (Django's password-change views), and the API keys they
made. Composed here, among the project's modules, because the email choices are
apps.control's and the keys apps.envapi's, two apps that do not import each other. Thin:
parse, call the services, render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from apps.control.notifications import notification_runs
from apps.envapi.selectors import api_keys_created_by
from apps.runs.invitations import account_email_set
from kernel.exceptions import InvalidInput
from rftweb.http import signed_in


@login_required
@require_http_methods(["GET", "POST"])
def account_page(request: HttpRequest) -> HttpResponse:
    user = signed_in(request)
    email = user.email
    error = ""
    if request.method == "POST":
        email = request.POST.get("email", "")
        try:
            account_email_set(user=user, email=email)
        except InvalidInput as exc:
            error = exc.message
        else:
            messages.success(request, f"Email address set to {user.email}." if user.email else "Email address removed.")
            return redirect("account")
    emailed_runs = sum(1 for _, wanted in notification_runs(user=user) if wanted)
    return render(request, "accounts/account.html", {
        "email": email, "error": error, "keys": api_keys_created_by(user=user), "emailed_runs": emailed_runs,
    }, status=400 if error else 200)
