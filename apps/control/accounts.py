"""Accounts without the admin site: an owner's invitations (by email or one-time link), the
page an invitation link opens, Django's password-reset pages to choose a password, and the
staff page that deactivates accounts. Thin: parse, call apps/runs/invitations.py, render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.forms import SetPasswordForm
from django.contrib.auth.models import AnonymousUser, User
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required, user_passes_test
from django.contrib.auth.tokens import default_token_generator
from django.db.models import Count, Q
from django.http import HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django.views.decorators.http import require_http_methods, require_POST

from apps.runs.access import run_for_page
from apps.runs.invitations import (
    account_active_set,
    account_create_invited,
    invitation_accept,
    invitation_create,
    invitation_find,
    invitation_revoke,
    invitation_send,
    invitations_open,
)
from apps.runs.models import Invitation, Run
from kernel.exceptions import RftError
from rftweb.http import HtmxHttpRequest, fragment, refusals, refused_back_to
from rftweb.login_guard import login_failures_forget

_RUNS = Run.objects.select_related("owner", "taskset")


def _is_staff(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(getattr(user, "is_staff", False) and user.is_active)


def invitations_context(run: Run, role: str, **extra: object) -> dict[str, object]:
    """The run page's invitation box (inside the People card)."""
    return {"run": run, "role": role, "invitations": invitations_open(run=run) if role == "owner" else [], **extra}


def _invite_box(request: HtmxHttpRequest, run: Run, role: str, status: int = 200, **extra: object) -> HttpResponse:
    context = {**invitations_context(run, role, **extra), "page_title": f"Invitations · {run.name}"}
    return fragment(request, "runs/_invitations.html", context, status=status, htmx_status=200)


def _invite_values(request: HtmxHttpRequest) -> dict[str, str]:
    return {"email": request.POST.get("email", "").strip(), "role": request.POST.get("role", "annotator")}


def _invite_refused(request: HtmxHttpRequest, error: RftError, run_id: int) -> HttpResponse:
    """The invitation form again, what was typed kept, the refusal beside its field."""
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    return _invite_box(request, run, role, status=400, invite_errors={error.field: [error.message]},
                       invite_values=_invite_values(request))


@login_required
@require_http_methods(["GET", "POST"])
@refusals(_invite_refused)
def run_invitations(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """GET: the run's open invitations. POST (owner): invite `email` as `role`, or, with no
    email, make a one-time link, shown once."""
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    if request.method == "GET":
        return _invite_box(request, run, role)
    values = _invite_values(request)
    made = invitation_create(run=run, role=values["role"], email=values["email"], actor=request.user)
    link = request.build_absolute_uri(reverse("invitation", kwargs={"token": made.token}))
    if made.invitation.email:
        invitation_send(made=made, url=link)
        said = f"Invitation sent to {made.invitation.email} as {made.invitation.role}."
        return _invite_box(request, run, role, invite_saved=said)
    return _invite_box(request, run, role, invite_link=link, invite_saved=(
        f"One-time link for a new {made.invitation.role}: copy it now, it is not shown again."))


def _revoke_refused(request: HtmxHttpRequest, error: RftError, run_id: int, **_: object) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    return _invite_box(request, run, role, status=error.status, invite_errors={"invitation": [error.message]})


@login_required
@require_POST
@refusals(_revoke_refused)
def run_invitation_revoke(request: HtmxHttpRequest, run_id: int, invitation_id: int) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    invitation_revoke(run=run, invitation_id=invitation_id, actor=request.user)
    return _invite_box(request, run, role, invite_saved="Invitation revoked: its link no longer works.")


def _invitation_gone(request: HtmxHttpRequest, error: RftError, token: str) -> HttpResponse:
    return render(request, "accounts/invitation.html", {"gone": error.message}, status=404)


@require_http_methods(["GET", "POST"])
@refusals(_invitation_gone)
def invitation_open(request: HtmxHttpRequest, token: str) -> HttpResponseBase:
    """Where an invitation link lands. Logged in: join the run. Not: choose a username (the
    invitation's email is the account's), then a password on Django's reset-confirm page."""
    invitation = invitation_find(token=token)
    context: dict[str, object] = {"invitation": invitation, "run": invitation.run, "token": token,
                               "values": {"username": request.POST.get("username", "") or invitation.email.split("@")[0],
                                          "email": request.POST.get("email", "")}}
    if request.method == "GET":
        return render(request, "accounts/invitation.html", context)
    return _invitation_take(request, invitation, context)


def _invitation_refused(request: HtmxHttpRequest, error: RftError, invitation: Invitation,
                        context: dict[str, object]) -> HttpResponse:
    """The invitation's form again, the refusal beside its field."""
    return render(request, "accounts/invitation.html", {**context, "errors": {error.field: [error.message]}},
                  status=400 if error.status < 500 else error.status)


@refusals(_invitation_refused)
def _invitation_take(request: HtmxHttpRequest, invitation: Invitation, context: dict[str, object]) -> HttpResponseBase:
    """Join the run (signed in), or make the invited account and choose its password."""
    token = str(context["token"])
    if request.user.is_authenticated:
        invitation_accept(token=token, user=request.user)
        messages.success(request, f"You are now {invitation.role} of “{invitation.run.name}”.")
        return redirect("runs:detail", run_id=invitation.run_id)
    user = account_create_invited(token=token, username=request.POST.get("username", ""),
                                  email=request.POST.get("email", ""))
    # The account has no password yet: Django's reset confirmation sets the first one.
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    return redirect("password_reset_confirm", uidb64=uid, token=default_token_generator.make_token(user))


class PasswordSetView(auth_views.PasswordResetConfirmView):
    """Django's reset confirmation: choosing a new password (or the first one, after an
    invitation) logs the person in and takes them to their runs."""

    post_reset_login = True
    # Two backends are configured (axes' lockout check first, rftweb/login_guard.py): name
    # the one that logs people in.
    post_reset_login_backend = "django.contrib.auth.backends.ModelBackend"
    success_url = reverse_lazy("runs:list")

    def form_valid(self, form: SetPasswordForm[User]) -> HttpResponse:
        response = super().form_valid(form)
        # The owner of the mailbox: wrong passwords counted for this username no longer pause it.
        login_failures_forget(username=form.user.get_username())
        messages.success(self.request, "Your password is set; you are logged in.")
        return response


@login_required
@user_passes_test(_is_staff)
@require_http_methods(["GET"])
def account_list(request: HtmxHttpRequest) -> HttpResponse:
    """Staff: every account, its runs and whether it may log in."""
    query = request.GET.get("q", "").strip()
    users = User.objects.annotate(
        owned=Count("runs", distinct=True), member_of=Count("run_memberships", distinct=True)).order_by("username")
    if query:
        users = users.filter(Q(username__icontains=query) | Q(email__icontains=query))
    return render(request, "accounts/list.html", {"accounts": users[:500], "q": query})


def _accounts_page(request: HtmxHttpRequest, *args: object, **kwargs: object) -> str:
    return reverse("accounts")


@login_required
@user_passes_test(_is_staff)
@require_POST
@refusals(refused_back_to(_accounts_page))
def account_active(request: HtmxHttpRequest, user_id: int) -> HttpResponse:
    """Staff: deactivate (active=0) or reactivate (active=1) an account."""
    active = request.POST.get("active") == "1"
    user = account_active_set(user_id=user_id, active=active, actor=request.user)
    messages.success(request, f"{user.get_username()} is {'active again' if active else 'deactivated: they cannot log in'}.")
    return redirect("accounts")
