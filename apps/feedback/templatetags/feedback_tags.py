from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import SupportsFloat

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from apps.feedback.kinds import FeedbackKind, kind_get, kinds
from apps.feedback.rendering import is_long, markdown_safe
from apps.runs.models import AuditEntry
from apps.runs.selectors import audit_text

register = template.Library()


@register.simple_tag
def kind_panels() -> list[FeedbackKind]:
    """The kinds with a panel on the annotation page, in the registry's order: each item's card
    links to them (feedback/_item.html), by their `panel_order`."""
    return sorted((k for k in kinds() if k.panel_template), key=lambda k: k.panel_order)


@register.simple_tag
def kinds_for_script() -> dict[str, object]:
    """What the annotation page's script knows of the kinds (static/feedback/annotate.js): the
    ones that count toward a person's day, and what an item's card says once given one."""
    return {"labels": [k.name for k in kinds() if k.labels],
            "marks": {k.name: k.page_mark for k in kinds() if k.page_mark}}


@register.filter
def completion(text: str) -> SafeString:
    """A completion as sanitised Markdown; long ones collapsed behind a <details>."""
    body = mark_safe(markdown_safe(text))
    if not is_long(text):
        return format_html('<div class="md">{}</div>', body)
    lines = (text or "").count("\n") + 1
    return format_html(
        '<details class="long"><summary>Long output: {} lines, {} characters. Show all</summary>'
        '<div class="md">{}</div></details>',
        lines, len(text), body,
    )


def _number(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-3 or abs(value) >= 1e4 else f"{round(value, 3):g}"
    return str(value)


# Derived or internal parts of a stored value that people do not need to read.
_HIDDEN_KEYS = {"normalised", "normalized", "expert_id"}


@register.filter
def feedback_value(value: object, kind: str = "") -> str:
    """A stored feedback value as people read it: "4/5", "thumb up (good)", "A better",
    "#3 > #1 > #2", "flagged: unsafe", rounded numbers; never a Python repr. Unknown shapes
    come out as "key value" pairs."""
    if not isinstance(value, dict):
        return "" if value is None else _number(value)
    parts: list[str] = []
    for key, v in value.items():
        if v is None or v == [] or v == "" or key in _HIDDEN_KEYS:
            continue
        if key == "score":
            parts.append(f"{_number(v)}/5")
        elif key == "thumb":
            parts.append({"up": "thumb up (good)", "down": "thumb down (bad)"}.get(str(v), f"thumb {v}"))
        elif key == "flags" and isinstance(v, list):
            # Beside its kind ("flag #12: broken") the word "flagged" would say it twice.
            said = "" if kind == "flag" else "flagged: "
            parts.append(said + ", ".join(str(f).replace("_", " ") for f in v))
        elif key == "order" and isinstance(v, list):
            parts.append(" > ".join(f"#{i}" for i in v))
        elif key == "winner":
            parts.append({"a": "A better", "b": "B better", "tie": "tie"}.get(str(v).lower(), f"winner {v}"))
        elif isinstance(v, (dict, list)):
            continue  # nested detail (an edit's text, a session) is shown elsewhere
        else:
            parts.append(f"{str(key).replace('_', ' ')} {_number(v)}")
    return " · ".join(parts)


def _flat(value: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Nested settings by their dotted names: {"selection": {"variance": 1}} -> {"selection.variance": 1}."""
    out: dict[str, object] = {}
    for key, v in value.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(v, dict):
            out.update(_flat(v, path))
        else:
            out[path] = v
    return out


def _setting(value: object) -> str:
    if isinstance(value, str):
        return (value or "none") if len(value) <= 40 and "\n" not in value else "(text)"
    if isinstance(value, list):
        return ", ".join(_setting(v) for v in value) or "none"
    return "none" if value is None else _number(value)


@register.filter
def setting_changes(detail: object) -> str:
    """An audited settings change (`{"before": {...}, "after": {...}}`) as people read it:
    only what changed, nested settings by their dotted name, numbers rounded, long text as
    "changed" ("w_human 0.5 → 0.8 · guidelines changed"); never a Python repr."""
    if not isinstance(detail, dict) or not isinstance(detail.get("after"), dict):
        return ""
    before, after = _flat(detail.get("before") or {}), _flat(detail["after"])
    parts: list[str] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if isinstance(new, str) and _setting(new) == "(text)" or isinstance(old, str) and _setting(old) == "(text)":
            parts.append(f"{key} {'cleared' if not new else 'changed' if old else 'set'}")
        elif key not in before:
            parts.append(f"{key} {_setting(new)}")
        else:
            parts.append(f"{key} {_setting(old)} → {_setting(new)}")
    return " · ".join(parts) or "no change"


@register.filter
def readable_number(value: SupportsFloat | str | None) -> str:
    """A number rounded for people (3 significant places after the point), "–" for none."""
    if value is None or value == "":
        return "–"
    try:
        return _number(float(value)) if not isinstance(value, int) else str(value)
    except (TypeError, ValueError):
        return str(value)


@register.filter
def kind_noun(kind: str, count: int = 2) -> str:
    """A kind of feedback as people call `count` of them: "1 rating", "3 A/B choices"."""
    try:
        return kind_get(str(kind)).noun(int(count))
    except (KeyError, ValueError):
        return str(kind).replace("_", " ")


@register.filter
def duration_words(value: timedelta | float | None) -> str:
    """A timedelta as people say it: "2 h 5 min", "4 min 10 s", "12 s"."""
    seconds = int(value.total_seconds()) if isinstance(value, timedelta) else int(value or 0)
    days, rest = divmod(max(seconds, 0), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


@register.filter
def stars(answer: float | str | None) -> str:
    """A rating on the human scale [0, 1] as the 1–5 stars people gave: 1.0 is "5★"."""
    if answer is None:
        return "–"
    try:
        return f"{round(float(answer) * 4 + 1)}★"
    except ValueError:
        return "–"


@register.filter
def audit_words(entry: AuditEntry) -> str:
    """An audit entry's action as people say it: "started by owner", "finished"."""
    return audit_text(action=str(entry.action), actor=entry.actor)
