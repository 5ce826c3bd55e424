from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from apps.feedback.rendering import is_long, markdown_safe

register = template.Library()


@register.filter
def completion(text: str) -> SafeString:
    """A completion as sanitised Markdown; long ones collapsed behind a <details>."""
    body = mark_safe(markdown_safe(text))  # noqa: S308 - nh3-cleaned just above
    if not is_long(text):
        return format_html('<div class="md">{}</div>', body)
    lines = (text or "").count("\n") + 1
    return format_html(
        '<details class="long"><summary>Long output: {} lines, {} characters. Show all</summary>'
        '<div class="md">{}</div></details>',
        lines, len(text), body,
    )
