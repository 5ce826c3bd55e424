"""Rewrite feedback stored in the old shapes into the one shape per kind (see Feedback).

The environment API used to store a pairwise choice as {"preferred": "a"}, a rating, an
env_reward and a flag as a bare number; older code read "left"/"right", any case, or the
winning experience's id. The trainer and the DPO export read only {"winner": …} now, the
policy fold only {"normalised": …}: every such row is rewritten here with its meaning kept.

Where the old value has no readable meaning, the row is kept (nothing collected is lost)
with the original under "legacy": a rating number that is not a whole 1..5 score
(normalised null: never folded; the old fold crashed on it), a choice naming no side
(a tie: no preference, as the trainer read it before).

Self-contained on purpose: a migration must not change meaning when the app code does.
"""

from __future__ import annotations

import math
from typing import Any

from django.db import migrations

FLAGS = ("unsafe", "broken", "off_task")
API_FLAG_REASON = "flagged through the environment API"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _winner(value: Any, a: int | None, b: int | None) -> str | None:
    if isinstance(value, dict):
        value = value.get("winner", value.get("preferred"))
    if isinstance(value, str):
        return {"a": "a", "left": "a", "b": "b", "right": "b", "tie": "tie"}.get(value.strip().lower())
    if _number(value) is not None and value == int(value):
        if a is not None and int(value) == a:
            return "a"
        if b is not None and int(value) == b:
            return "b"
    return None


def value_upgrade(kind: str, value: Any, *, comment: str = "", experience_id: int | None = None,
                  other_id: int | None = None) -> dict[str, Any] | None:
    """The one-shape value of an old row, or None when it is in the one shape already."""
    if kind == "pairwise":
        if isinstance(value, dict) and set(value) == {"winner"} and value["winner"] in ("a", "b", "tie"):
            return None
        winner = _winner(value, experience_id, other_id)
        return {"winner": winner} if winner else {"winner": "tie", "legacy": value}
    if kind == "rating":
        if isinstance(value, dict) and {"score", "thumb", "normalised"} <= set(value):
            return None
        if isinstance(value, dict):
            score, thumb = value.get("score"), value.get("thumb")
            if thumb in ("up", "down"):
                return {"score": None, "thumb": thumb, "normalised": 1.0 if thumb == "up" else 0.0}
            value = score if score is not None else value.get("value")
        number = _number(value)
        if number is not None and number.is_integer() and 1 <= number <= 5:
            return {"score": int(number), "thumb": None, "normalised": (number - 1) / 4}
        return {"score": None, "thumb": None, "normalised": None, "legacy": value}
    if kind == "env_reward":
        if isinstance(value, dict) and set(value) == {"reward", "reward_parts"}:
            return None
        parts = value.get("reward_parts") or {} if isinstance(value, dict) else {}
        number = _number(value.get("reward") if isinstance(value, dict) else value)
        if number is None:
            return {"reward": None, "reward_parts": parts, "legacy": value}
        return {"reward": number, "reward_parts": parts}
    if kind == "flag":
        if isinstance(value, dict) and set(value) == {"flags", "reason"}:
            return None
        flags: list[str] = []
        reason = ""
        if isinstance(value, dict):
            raw = value.get("flags") or []
            flags = sorted({f for f in raw if f in FLAGS}) if isinstance(raw, list) else []
            reason = str(value.get("reason") or "")
        elif isinstance(value, str) and value.strip():
            reason = value.strip()
        if not flags and not reason:
            reason = (comment or "").strip() or API_FLAG_REASON
        return {"flags": flags, "reason": reason}
    return None


def forwards(apps: Any, schema_editor: Any) -> None:
    Feedback = apps.get_model("feedback", "Feedback")
    rows = Feedback.objects.filter(kind__in=["pairwise", "rating", "env_reward", "flag"]).only(
        "id", "kind", "value", "comment", "experience_id", "other_id")
    for fb in rows.iterator(chunk_size=2000):
        new = value_upgrade(fb.kind, fb.value, comment=fb.comment, experience_id=fb.experience_id,
                            other_id=fb.other_id)
        if new is not None:
            Feedback.objects.filter(pk=fb.pk).update(value=new)


class Migration(migrations.Migration):
    dependencies = [("feedback", "0002_assignment")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
