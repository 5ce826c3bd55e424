"""Bringing people to a run without the admin site: an owner invites by email address or
makes a one-time link, with a role; whoever opens it first, before it expires, joins the run
with that role (making an account if they have none: they then choose their password through
Django's password-reset machinery). Staff deactivate accounts.

The token is shown or sent once and only its sha256 is stored, so the database alone does
not let anyone join. An invitation is used at most once: the accepting UPDATE is conditional
on it being unused and unexpired.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.runs.events import runs_list_touch
from apps.runs.models import AuditEntry, Invitation, Run, RunMember
from kernel.exceptions import Conflict, InvalidInput, NotFound


class InvitationInvalid(InvalidInput):
    """An invitation that cannot be made as asked; `field` names the form field at fault."""

    code = "invitation_invalid"


class InvitationGone(NotFound):
    """No usable invitation under this token: never made, used already, revoked or expired."""

    code = "invitation_gone"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


Actor = AbstractBaseUser | AnonymousUser | None


def _who(actor: Actor) -> User | None:
    return actor if isinstance(actor, User) and actor.is_authenticated else None


@dataclass(frozen=True)
class InvitationMade:
    invitation: Invitation
    # The secret part of the link: shown or sent once, never stored.
    token: str


def invitation_create(*, run: Run, role: str, email: str = "", actor: Actor = None) -> InvitationMade:
    """A new invitation to `run` as `role`, for `email` (sent by `invitation_send`) or, with
    no email, as a one-time link for the owner to hand over."""
    if role not in RunMember.Role.values:
        raise InvitationInvalid(f"role must be one of: {', '.join(RunMember.Role.values)}", field="role")
    email = (email or "").strip()
    if email:
        try:
            validate_email(email)
        except ValidationError:
            raise InvitationInvalid(f"{email!r} is not an email address", field="email") from None
        if User.objects.filter(pk=run.owner_id, email__iexact=email).exists():
            raise InvitationInvalid(f"{email} owns this run already", field="email")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        invitation = Invitation.objects.create(
            run=run, role=role, email=email, token_digest=_digest(token), created_by=_who(actor),
            expires_at=timezone.now() + timedelta(days=settings.RFT_INVITATION_DAYS),
        )
        AuditEntry.objects.create(run=run, actor=_who(actor), action="invite",
                                  detail={"user": email or "a one-time link", "role": role})
    return InvitationMade(invitation=invitation, token=token)


def invitation_send(*, made: InvitationMade, url: str) -> None:
    """Email the invitation's link (`url`, absolute) through Django's email backend (the
    console backend unless EMAIL_BACKEND says otherwise)."""
    invitation = made.invitation
    inviter = invitation.created_by.get_username() if invitation.created_by else "The owner"
    send_mail(
        subject=f"You are invited to the run “{invitation.run.name}” on rftweb",
        message=(f"{inviter} invites you to the run “{invitation.run.name}” as {invitation.role}.\n\n"
                 f"Open this link to join (once, within {settings.RFT_INVITATION_DAYS} days); if you have no "
                 f"account yet you choose a username and a password there:\n\n{url}\n"),
        from_email=None,
        recipient_list=[invitation.email],
    )


def invitations_open(*, run: Run) -> list[Invitation]:
    """The run's invitations nobody used yet and that have not expired, newest first."""
    return list(Invitation.objects.filter(run=run, used_at__isnull=True, expires_at__gt=timezone.now())
                .order_by("-created_at"))


def invitation_revoke(*, run: Run, invitation_id: int, actor: Actor = None) -> None:
    with transaction.atomic():
        gone = Invitation.objects.filter(run=run, pk=invitation_id, used_at__isnull=True).update(
            expires_at=timezone.now())
        if not gone:
            raise InvitationGone("no open invitation of this run under that id", field="invitation")
        AuditEntry.objects.create(run=run, actor=_who(actor), action="invite_revoke", detail={"invitation": invitation_id})


def invitation_find(*, token: str) -> Invitation:
    """The usable invitation under `token`; InvitationGone otherwise (the same answer for a
    token never made, used, revoked or expired: nothing to learn from it)."""
    invitation = (Invitation.objects.select_related("run", "run__owner")
                  .filter(token_digest=_digest(token or ""), used_at__isnull=True, expires_at__gt=timezone.now())
                  .first())
    if invitation is None:
        raise InvitationGone("this invitation link is not valid: it was used already, revoked or has expired",
                             field="token")
    return invitation


def invitation_accept(*, token: str, user: AbstractBaseUser | AnonymousUser) -> RunMember | None:
    """`user` joins the invitation's run with its role, and the invitation is used up.
    None when `user` owns the run already (nothing to join). A role they hold already on the
    run is replaced by the invitation's."""
    if not isinstance(user, User) or not user.is_authenticated:
        raise InvitationInvalid("log in, or make an account, to accept an invitation", field="user")
    invitation = invitation_find(token=token)
    run = invitation.run
    with transaction.atomic():
        taken = Invitation.objects.filter(pk=invitation.pk, used_at__isnull=True, expires_at__gt=timezone.now()).update(
            used_at=timezone.now(), used_by=user)
        if not taken:
            raise InvitationGone("this invitation link was used a moment ago", field="token")
        member = None
        if user.pk != run.owner_id:
            member, _ = RunMember.objects.update_or_create(run=run, user=user, defaults={"role": invitation.role})
        AuditEntry.objects.create(run=run, actor=user, action="invite_used",
                                  detail={"user": user.get_username(), "role": invitation.role})
    run_id = run.pk
    transaction.on_commit(lambda: runs_list_touch(run_id=run_id))  # the run appears on their list
    return member


_USERNAME = re.compile(r"^[\w.@+-]{1,150}$")


def account_create_invited(*, token: str, username: str, email: str = "") -> User:
    """A new account for the person opening an invitation (no password yet: they choose one
    next, through the password-reset confirmation), joined to the invitation's run. An email
    invitation's address is the account's."""
    invitation = invitation_find(token=token)
    username = (username or "").strip()
    if not _USERNAME.match(username):
        raise InvitationInvalid("a username is 1 to 150 letters, digits and @ . + - _", field="username")
    address = invitation.email or (email or "").strip()
    if address and not invitation.email:
        try:
            validate_email(address)
        except ValidationError:
            raise InvitationInvalid(f"{address!r} is not an email address", field="email") from None
    if User.objects.filter(username__iexact=username).exists():
        raise InvitationInvalid(f"the username {username!r} is taken: choose another, or log in if it is yours",
                                field="username")
    try:
        with transaction.atomic():
            user = User.objects.create_user(username=username, email=address)
            user.set_unusable_password()
            user.save(update_fields=["password"])
            invitation_accept(token=token, user=user)
    except IntegrityError:
        raise InvitationInvalid(f"the username {username!r} is taken", field="username") from None
    return user


def account_active_set(*, user_id: int, active: bool, actor: Actor) -> User:
    """Staff deactivate (or reactivate) an account: a deactivated person cannot log in, and
    their open sessions end at their next request (Django's ModelBackend refuses inactive
    users). Their feedback and runs stay. Staff cannot deactivate themselves."""
    user = User.objects.filter(pk=user_id).first()
    if user is None:
        raise NotFound("no such account", field="user")
    if not active and user.pk == getattr(actor, "pk", None):
        raise Conflict("you cannot deactivate your own account", field="user")
    if user.is_active != active:
        user.is_active = active
        user.save(update_fields=["is_active"])
    return user


def account_email_set(*, user: User, email: str) -> User:
    """The address `user` gets email at (a run's end, a password reset); blank clears it. An
    address that is not one is refused naming the field."""
    address = (email or "").strip()
    if address:
        try:
            validate_email(address)
        except ValidationError:
            raise InvalidInput(f"{address!r} is not an email address", field="email") from None
        address = User.objects.normalize_email(address)
    if user.email != address:
        user.email = address
        user.save(update_fields=["email"])
    return user
