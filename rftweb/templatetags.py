"""Filters every template has (TEMPLATES' `builtins` in settings.py), so no page loads them.

`{{ when|ago }}`: "just now" under a minute, else Django's timesince with "ago" — where the
pages wrote `{{ when|timesince }} ago`, a notice a few seconds old read "0 minutes ago"."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

register = template.Library()


@register.filter
def ago(when: datetime | None) -> str:
    if when is None:
        return ""
    if timezone.now() - when < timedelta(minutes=1):
        return "just now"
    return f"{timesince(when)} ago"
