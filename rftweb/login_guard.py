"""Login protection (django-axes): failed logins are counted per account and per address
(`AXES_LOCKOUT_PARAMETERS`); RFT_LOGIN_FAILURE_LIMIT failures lock that account, and that
address, for RFT_LOGIN_LOCKOUT_SECONDS, on the login page and the admin login alike. During
the lock the right password is refused with the same message. Every attempt is audited in
axes' tables (AccessAttempt, AccessFailureLog), shown in the admin."""

from __future__ import annotations

from collections.abc import Mapping

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class LoginGuardBackend(AxesStandaloneBackend):
    """Axes' check before Django's ModelBackend. A call without a request (Django's test
    client `login`, code that checks a password) has no address to count: it is let through
    to the next backend, as it was before axes."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None,
                     **kwargs: object) -> None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)  # type: ignore[no-any-return]


def lockout_message() -> str:
    minutes = max(1, round(settings.RFT_LOGIN_LOCKOUT_SECONDS / 60))
    return (f"Too many failed logins for this account or from this address ({settings.RFT_LOGIN_FAILURE_LIMIT} in a row): "
            f"logging in is locked for {minutes} minutes, and until then even the right password is refused.")


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: Mapping[str, object] | None = None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the same page, 429 with Retry-After, wherever the login was."""
    response = render(request, "registration/locked_out.html", {"message": lockout_message()}, status=429)
    response["Retry-After"] = str(settings.RFT_LOGIN_LOCKOUT_SECONDS)
    return response
