"""Template context every page gets: the header's unread-notifications count."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.contrib.auth.models import User
from django.http import HttpRequest

from apps.control.notifications import notifications_unread_count


def notifications_badge(request: HttpRequest) -> dict[str, Callable[[], int]]:
    """Counted only where a template shows it (the header, on full pages): the fragments a
    page asks for every few seconds (the annotation header's counts, a label's answer) render
    without the header and skip the statement. A template calls a callable it is given;
    functools.cache counts once however often the page shows it."""
    user = getattr(request, "user", None)
    if not isinstance(user, User):
        return {}
    return {"notifications_unread": functools.cache(lambda: notifications_unread_count(user=user))}
