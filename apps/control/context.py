"""Template context every page gets: the header's unread-notifications count."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.http import HttpRequest

from apps.control.notifications import notifications_unread_count


def notifications_badge(request: HttpRequest) -> dict[str, int]:
    user = getattr(request, "user", None)
    if not isinstance(user, User):
        return {}
    return {"notifications_unread": notifications_unread_count(user=user)}
