"""The request the views see: Django's, with the `htmx` details that django-htmx's
middleware sets on every request (its documented typing pattern)."""

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def signed_in(request: HttpRequest) -> User:
    """The person behind a login_required view (an anonymous one never gets that far: refused
    as unauthorised should it ever happen)."""
    if not isinstance(request.user, User):
        raise PermissionDenied("sign in first")
    return request.user
