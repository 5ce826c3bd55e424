"""The project's URLs plus the bench's baseline: a minimal Django JSON view that stores the
same experience row with the ORM and nothing else (no key, no validation, no rate limit)."""

from __future__ import annotations

import json

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from apps.buffer.models import Experience
from rftweb.urls import urlpatterns as project_urlpatterns


@csrf_exempt
def baseline_write(request: HttpRequest, run_id: int) -> JsonResponse:
    item = json.loads(request.body)["trajectories"][0]
    exp = Experience.objects.create(
        run_id=run_id, key=item["key"], group_id=item.get("group_id") or item["key"], source="env",
        messages=item.get("messages"), token_ids=item.get("token_ids") or [], prompt_length=item.get("prompt_length") or 0,
        logprobs=item.get("logprobs"), reward=item.get("reward"), auto_reward=item.get("reward"),
        reward_parts=item.get("reward_parts") or {},
    )
    return JsonResponse({"id": exp.pk})


@csrf_exempt
def baseline_echo(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True, "bytes": len(request.body)})


urlpatterns = [
    path("bench/baseline/<int:run_id>/", baseline_write),
    path("bench/echo/", baseline_echo),
    *project_urlpatterns,
]
