"""`{% task_images run digests %}`: the pictures a prompt showed, as thumbnails that open
larger (a `<details>`, no script) with a plain link to the full picture."""

from __future__ import annotations

from collections.abc import Iterable
from django import template

from apps.buffer.models import TasksetImage
from apps.runs.models import Run

register = template.Library()


@register.inclusion_tag("runs/_images.html")
def task_images(run: Run, digests: Iterable[object] | None) -> dict[str, object]:
    digests = [d for d in (digests or []) if isinstance(d, str)]
    rows = {r.sha256: r for r in TasksetImage.objects.filter(taskset_id=run.taskset_id, sha256__in=digests)} \
        if digests and run.taskset_id is not None else {}
    # Only pictures of the run's taskset: the same rule the image view keeps.
    return {"run": run, "images": [rows[d] for d in digests if d in rows]}
