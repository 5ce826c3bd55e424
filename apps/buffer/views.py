"""Serving task pictures to the people of a run.

`GET /runs/<run>/images/<sha256>/` answers the stored bytes to the run's owner, annotators
and viewers (404 to anyone else, as every run page), and only for a picture of the run's
taskset: a digest is not a capability. The content type is the one found in the bytes at
import (PNG, JPEG, GIF, WebP), never sniffed (`nosniff`), never a document: the response
carries its own `sandbox` policy so nothing in it could run even when opened on its own.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET

from apps.buffer.images import CONTENT_TYPES, DIGEST, image_path
from apps.buffer.models import TasksetImage
from apps.runs.models import Run
from apps.runs.selectors import run_role

_EXTENSIONS = {v: k.lower().replace("jpeg", "jpg") for k, v in CONTENT_TYPES.items()}


@login_required
@require_GET
def task_image(request: HttpRequest, run_id: int, sha256: str) -> FileResponse:
    run = get_object_or_404(Run, pk=run_id)
    if run_role(run=run, user=request.user) is None or not DIGEST.match(sha256):
        raise Http404("no such run")
    if run.taskset_id is None:
        raise Http404("the run has no taskset")
    row = TasksetImage.objects.filter(taskset_id=run.taskset_id, sha256=sha256).first()
    if row is None or row.content_type not in _EXTENSIONS:
        raise Http404("no such image in this run")
    try:
        handle = image_path(sha256).open("rb")
    except OSError:
        raise Http404("the image is missing from storage") from None
    response = FileResponse(handle, content_type=row.content_type)
    # The name shown for a download is the digest: the uploader's file name is untrusted text.
    response["Content-Disposition"] = f'inline; filename="{sha256[:16]}.{_EXTENSIONS[row.content_type]}"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, max-age=86400, immutable"
    return response
