"""Login protection (django-axes) that slows the guesser without locking out the owner.

Failed logins are counted per username *from one address* and per address (axes'
AXES_LOCKOUT_PARAMETERS, `[["username", "ip_address"], "ip_address"]`), never per account
alone: RFT_LOGIN_FAILURE_LIMIT wrong passwords for one username from one address pause that
username's logins from that address, and RFT_LOGIN_ADDRESS_FAILURE_LIMIT failures from one
address (for any usernames: a sprayer) pause that address, each for RFT_LOGIN_LOCKOUT_SECONDS.
So a stranger guessing someone's password locks only themselves out: the person, from an
address that has not failed, logs in with the right password; and the forgotten-password
path never asks for a password at all. A success clears only that username's count from that
address (not the address's: a sprayer with an account of their own must not reset it by
logging in), and a password set through the reset link clears that username's counts.

The address is the connecting peer's, or the one the proxies named in FORWARDED_ALLOW_IPS
report (rftweb/asgi.py): a client cannot pick its own address with a header. Every failure,
and every lock (`locked_out`), is audited in axes' tables (AccessAttempt, AccessFailureLog),
shown in the admin, and each lock is logged as a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from axes.handlers.database import AxesDatabaseHandler
from axes.backends import AxesStandaloneBackend
from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

log = logging.getLogger(__name__)


class LoginGuardBackend(AxesStandaloneBackend):  # type: ignore[misc]  # axes ships no types
    """Axes' check before Django's ModelBackend. A call without a request (Django's test
    client `login`, code that checks a password) has no address to count: it is let through
    to the next backend, as it was before axes."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None,
                     **kwargs: object) -> None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)  # type: ignore[no-any-return]


def _failures(attempts: QuerySet[AccessAttempt]) -> int:
    return int(attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0)


class LoginGuardHandler(AxesDatabaseHandler):  # type: ignore[misc]  # axes is untyped
    """Axes' database handler (every attempt in its tables) with two limits instead of one:
    the username-from-this-address count against RFT_LOGIN_FAILURE_LIMIT, the address's count
    against RFT_LOGIN_ADDRESS_FAILURE_LIMIT. Axes compares one number with one limit: this
    reports the pair's count, or the pair's limit once the address is over its own."""

    def get_failures(self, request: HttpRequest, credentials: Mapping[str, object] | None = None) -> int:
        pair, address = (_failures(attempts) for attempts in self.get_user_attempts(request, credentials))
        if address >= settings.RFT_LOGIN_ADDRESS_FAILURE_LIMIT:
            return max(pair, settings.RFT_LOGIN_FAILURE_LIMIT)
        return pair

    def user_login_failed(self, sender: object, credentials: dict[str, object], request: HttpRequest | None = None,
                          **kwargs: object) -> None:
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is not None and getattr(request, "axes_locked_out", False):
            log.warning("login paused for %s minutes: username %r from %s (%s failures)",
                        lockout_minutes(), get_client_username(request, credentials), request.axes_ip_address,  # type: ignore[attr-defined]
                        getattr(request, "axes_failures_since_start", "?"))

    def reset_user_attempts(self, request: HttpRequest, credentials: Mapping[str, object] | None = None) -> int:
        """After a success: this username's count from this address only."""
        count, _ = AccessAttempt.objects.filter(username=get_client_username(request, credentials),
                                                ip_address=request.axes_ip_address).delete()  # type: ignore[attr-defined]
        return int(count)


def login_failures_forget(*, username: str) -> None:
    """The person proved they own the account (a password set through the reset link): the
    failures counted for its username, from every address, go."""
    AccessAttempt.objects.filter(username=username).delete()


def lockout_minutes() -> int:
    return max(1, round(settings.RFT_LOGIN_LOCKOUT_SECONDS / 60))


def lockout_message() -> str:
    return (f"Too many failed logins from your address (for this username: {settings.RFT_LOGIN_FAILURE_LIMIT}; "
            f"for any: {settings.RFT_LOGIN_ADDRESS_FAILURE_LIMIT}): logging in from here is paused for "
            f"{lockout_minutes()} minutes. The account itself is not locked: from another address it logs in "
            "as usual, and a password reset by email works now.")


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: Mapping[str, object] | None = None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the same page, 429 with Retry-After, wherever the login was."""
    response = render(request, "registration/locked_out.html", {"message": lockout_message()}, status=429)
    response["Retry-After"] = str(settings.RFT_LOGIN_LOCKOUT_SECONDS)
    return response
