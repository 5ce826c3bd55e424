"""The runs dashboard: list, creation, the live run page, controls, experience browser,
exports. Thin: parse, call a selector or service, render. Partials serve HTMX and, requested
without HTMX, render as whole pages so every link works without JavaScript."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.buffer.exports import EXPORT_KINDS, ExportFailed, ExportOptions, export_jsonl_chunks
from apps.buffer.importers import ImportFailed
from apps.buffer.selectors import (
    buffer_counts,
    experience_filter_choices,
    experience_filters_parse,
    experience_group_detail,
    experiences_browse,
    group_feedback,
)
from apps.runs.config import ConfigInvalid, config_parse
from apps.runs.forms import (
    CONFIG_FILE,
    FORM,
    config_field_specs,
    config_from_post,
    errors_by_field,
    feedback_field_specs,
    section_specs,
    values_from_config,
)
from apps.runs.heartbeat import workers_health
from apps.runs.models import Run
from apps.runs.selectors import (
    CHART_GROUPS,
    eval_best,
    feedback_per_minute,
    metric_series,
    run_audit,
    run_role,
    run_rows,
    weight_sync_timeline,
)
from apps.runs.services import TransitionNotAllowed, run_create_with_taskset, run_feedback_policy_update, run_transition

CONTROLS: dict[str, dict[str, str]] = {
    "start": {"label": "Start", "question": "Start run “{name}”? Explorers and trainers begin work."},
    "pause": {"label": "Pause", "question": "Pause run “{name}”? Workers finish their current step and wait."},
    "resume": {"label": "Resume", "question": "Resume run “{name}”?"},
    "stop": {"label": "Stop", "question": "Stop run “{name}”? A stopped run can be started again from the last version."},
}
_ALLOWED: dict[str, list[str]] = {
    Run.Status.DRAFT: ["start", "stop"],
    Run.Status.RUNNING: ["pause", "stop"],
    Run.Status.PAUSED: ["resume", "stop"],
    Run.Status.STOPPED: ["start"],
    Run.Status.FAILED: ["start"],
}


def _run_for(request: HttpRequest, run_id: int, *, owner: bool = False) -> tuple[Run, str]:
    run = get_object_or_404(Run.objects.select_related("owner", "taskset"), pk=run_id)
    role = run_role(run=run, user=request.user)
    if role is None:
        raise Http404("no such run")
    if owner and role != "owner":
        raise PermissionDenied("only the run's owner or staff may do this")
    return run, role


def _partial(request: HttpRequest, template: str, context: dict[str, Any], page_title: str) -> HttpResponse:
    """An HTMX request gets the fragment; a plain one the fragment inside a page."""
    if request.htmx:
        return render(request, template, context)
    return render(request, "runs/partial_page.html", {**context, "fragment": template, "page_title": page_title})


# --- list and creation -------------------------------------------------------------------

@login_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/list.html", {"rows": run_rows(user=request.user)})


def _create_context(values: dict[str, str], errors: dict[str, list[str]], name: str = "") -> dict[str, Any]:
    specs = config_field_specs()
    for spec in specs:
        spec.value = values.get(spec.path, spec.default)  # type: ignore[attr-defined]
        spec.errors = errors.get(spec.path, [])  # type: ignore[attr-defined]
    return {
        "sections": [(section, errors.get(section, []), fields) for section, fields in section_specs(specs)],
        "errors": errors,
        "form_errors": errors.get(FORM, []),
        "name": name,
        "reward_names": _reward_names(),
    }


def _reward_names() -> list[str]:
    from apps.rewards.registry import reward_names

    return sorted(reward_names())


@login_required
@require_http_methods(["GET", "POST"])
def run_new(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return render(request, "runs/new.html", _create_context({}, {}))
    specs = config_field_specs()
    name = request.POST.get("name", "").strip()
    upload = request.FILES.get(CONFIG_FILE)
    errors: dict[str, list[str]] = {}
    if upload is not None:
        # The file is the config; its values fill the form so each error sits beside its field.
        text = upload.read().decode("utf-8", errors="replace")
        filename = upload.name or "config.yaml"
        try:
            config: Any = config_parse(text=text, filename=filename)
        except ConfigInvalid as exc:
            errors = errors_by_field(exc.errors, specs, fallback=CONFIG_FILE)
            return render(request, "runs/new.html", _create_context(_file_values(text, filename, specs), errors, name), status=400)
        values = values_from_config(config.model_dump(mode="json"), specs)
    else:
        config, read_errors = config_from_post(request.POST, specs)
        values = {k: v for k, v in request.POST.items() if k in {s.path for s in specs}}
        if read_errors:
            errors = errors_by_field(read_errors, specs)
            return render(request, "runs/new.html", _create_context(values, errors, name), status=400)
    taskset_file = request.FILES.get("taskset")
    try:
        if taskset_file is not None:
            suffix = Path(taskset_file.name or "").suffix.lower()
            if suffix not in {".jsonl", ".ndjson", ".parquet", ".pq"}:
                raise ImportFailed(f"{taskset_file.name}: upload a .jsonl or .parquet file")
            with tempfile.NamedTemporaryFile(suffix=suffix) as tmp:
                for chunk in taskset_file.chunks():
                    tmp.write(chunk)
                tmp.flush()
                run = run_create_with_taskset(
                    name=name, owner=request.user, config=config, taskset_path=tmp.name,
                    taskset_name=Path(taskset_file.name or "taskset").stem,
                )
        else:
            run = run_create_with_taskset(name=name, owner=request.user, config=config)
    except ConfigInvalid as exc:
        errors = errors_by_field(exc.errors, specs, fallback=CONFIG_FILE if upload is not None else FORM)
        return render(request, "runs/new.html", _create_context(values, errors, name), status=400)
    except ImportFailed as exc:
        return render(request, "runs/new.html", _create_context(values, {"taskset": [str(exc)]}, name), status=400)
    messages.success(request, f"Run “{run.name}” created as a draft.")
    return redirect("runs:detail", run_id=run.pk)


def _file_values(text: str, filename: str, specs: list[Any]) -> dict[str, str]:
    import json

    import yaml

    try:
        data = json.loads(text) if filename.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        return {}
    return values_from_config(data, specs)


# --- the run page ------------------------------------------------------------------------

def _controls_context(run: Run, role: str) -> dict[str, Any]:
    actions = _ALLOWED.get(run.status, []) if role == "owner" else []
    return {
        "run": run,
        "role": role,
        "controls": [{"action": a, **CONTROLS[a], "question": CONTROLS[a]["question"].format(name=run.name)} for a in actions],
    }


def _feedback_form_context(run: Run, values: dict[str, str] | None = None, errors: dict[str, list[str]] | None = None) -> dict[str, Any]:
    specs = feedback_field_specs()
    current = values_from_config(run.config, specs)
    for spec in specs:
        spec.value = (values or current).get(spec.path, spec.default)  # type: ignore[attr-defined]
        spec.errors = (errors or {}).get(spec.path, [])  # type: ignore[attr-defined]
    return {"feedback_fields": specs, "feedback_errors": (errors or {}).get("feedback", []) + (errors or {}).get(FORM, [])}


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run, role = _run_for(request, run_id)
    context = {
        **_controls_context(run, role),
        **_feedback_form_context(run),
        "cfg": run.cfg,
        "counts": buffer_counts(run=run),
        "timeline": weight_sync_timeline(run=run),
        "workers": workers_health(),
        "audit": run_audit(run=run, limit=20),
        "chart_data": {
            "groups": CHART_GROUPS,
            "series": metric_series(run=run),
            "feedback": feedback_per_minute(run=run),
            "counts": buffer_counts(run=run),
        },
        "export_kinds": EXPORT_KINDS,
        "eval_best": eval_best(run=run),
    }
    return render(request, "runs/detail.html", context)


@login_required
@require_GET
def run_metrics(request: HttpRequest, run_id: int) -> JsonResponse:
    run, _ = _run_for(request, run_id)
    if request.GET.get("only") == "counts":
        return JsonResponse({"counts": buffer_counts(run=run), "status": run.status})
    return JsonResponse({"series": metric_series(run=run), "feedback": feedback_per_minute(run=run),
                         "counts": buffer_counts(run=run), "status": run.status})


@login_required
@require_GET
def run_controls(request: HttpRequest, run_id: int) -> HttpResponse:
    run, role = _run_for(request, run_id)
    return _partial(request, "runs/_controls.html", _controls_context(run, role), f"Controls · {run.name}")


@login_required
@require_http_methods(["GET", "POST"])
def run_control(request: HttpRequest, run_id: int, action: str) -> HttpResponse:
    """GET: a confirmation page (the no-JavaScript path). POST with confirm=yes: do it."""
    run, role = _run_for(request, run_id, owner=True)
    if action not in CONTROLS:
        raise Http404("no such action")
    question = CONTROLS[action]["question"].format(name=run.name)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        return render(request, "runs/confirm.html", {"run": run, "action": action, "label": CONTROLS[action]["label"],
                                                      "question": question})
    error = ""
    try:
        run = run_transition(run=run, action=action, actor=request.user)
    except TransitionNotAllowed as exc:
        error = str(exc)
    if request.htmx:
        response = render(request, "runs/_controls.html", {**_controls_context(run, role), "error": error})
        if error:
            response.status_code = 200  # HTMX swaps only 2xx; the message is in the fragment
        return response
    if error:
        messages.error(request, error)
    else:
        messages.success(request, f"{CONTROLS[action]['label']}: run is now {run.status}.")
    return redirect("runs:detail", run_id=run.pk)


@login_required
@require_POST
def run_feedback_policy(request: HttpRequest, run_id: int) -> HttpResponse:
    run, role = _run_for(request, run_id, owner=True)
    specs = feedback_field_specs()
    values = {k: v for k, v in request.POST.items() if k in {s.path for s in specs}}
    errors: dict[str, list[str]] = {}
    if request.POST.get("confirm") != "yes":
        errors = {FORM: ["tick the box to confirm the change of policy"]}
    else:
        data, read_errors = config_from_post(request.POST, specs)
        if read_errors:
            errors = errors_by_field(read_errors, specs)
        else:
            try:
                run = run_feedback_policy_update(run=run, feedback=data.get("feedback", {}), actor=request.user)
            except ConfigInvalid as exc:
                errors = errors_by_field(exc.errors, specs)
    context = {"run": run, "role": role, **_feedback_form_context(run, values if errors else None, errors),
               "saved": not errors}
    if request.htmx:
        return render(request, "runs/_feedback_policy.html", context)
    if errors:
        return _partial(request, "runs/_feedback_policy.html", context, f"Feedback policy · {run.name}")
    messages.success(request, "Feedback policy updated.")
    return redirect("runs:detail", run_id=run.pk)


@login_required
@require_GET
def run_timeline(request: HttpRequest, run_id: int) -> HttpResponse:
    run, _ = _run_for(request, run_id)
    return _partial(request, "runs/_timeline.html", {"run": run, "timeline": weight_sync_timeline(run=run)},
                    f"Weight sync · {run.name}")


@login_required
@require_GET
def run_audit_log(request: HttpRequest, run_id: int) -> HttpResponse:
    run, _ = _run_for(request, run_id)
    return _partial(request, "runs/_audit.html", {"run": run, "audit": run_audit(run=run, limit=200)}, f"Audit · {run.name}")


@login_required
@require_GET
def worker_health(request: HttpRequest) -> HttpResponse:
    return _partial(request, "runs/_workers.html", {"workers": workers_health()}, "Workers")


# --- experiences ---------------------------------------------------------------------------

@login_required
@require_GET
def experience_list(request: HttpRequest, run_id: int) -> HttpResponse:
    run, _ = _run_for(request, run_id)
    filters = experience_filters_parse(request.GET)
    page_size = 50
    rows = [] if filters.errors else experiences_browse(run=run, filters=filters, limit=page_size + 1)
    more = len(rows) > page_size
    rows = rows[:page_size]
    context = {
        "run": run,
        "filters": filters,
        "choices": experience_filter_choices(run=run),
        "rows": rows,
        "next_query": filters.query(before=rows[-1].pk) if more and rows else "",
    }
    if request.htmx and request.htmx.target == "experience-results":
        return render(request, "runs/_experience_results.html", context)
    return render(request, "runs/experiences.html", context)


@login_required
@require_GET
def experience_group(request: HttpRequest, run_id: int, group_id: str) -> HttpResponse:
    run, _ = _run_for(request, run_id)
    members = experience_group_detail(run=run, group_id=group_id)
    if not members:
        raise Http404("no such group")
    return _partial(request, "runs/_group.html",
                    {"run": run, "group_id": group_id, "members": members,
                     "group_feedback": group_feedback(run=run, group_id=group_id)},
                    f"Group {group_id} · {run.name}")


# --- exports -------------------------------------------------------------------------------

@login_required
@require_GET
def export_page(request: HttpRequest, run_id: int) -> HttpResponse:
    run, _ = _run_for(request, run_id)
    return render(request, "runs/export.html", {"run": run, "kinds": EXPORT_KINDS})


def _export_options(params: Any) -> ExportOptions:
    def number(name: str, cast: type) -> Any:
        raw = (params.get(name) or "").strip()
        if not raw:
            return None
        try:
            return cast(raw)
        except ValueError:
            raise ExportFailed(f"{name}: {raw!r} is not {'a whole number' if cast is int else 'a number'}") from None

    return ExportOptions(
        min_reward=number("min_reward", float),
        min_version=number("min_version", int),
        domain=(params.get("domain") or "").strip() or None,
        min_margin=number("min_margin", float) or 0.0,
    )


@login_required
@require_GET
def export_download(request: HttpRequest, run_id: int, kind: str) -> HttpResponse:
    run, _ = _run_for(request, run_id)
    try:
        chunks = export_jsonl_chunks(run=run, kind=kind, options=_export_options(request.GET))
    except ExportFailed as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    response = StreamingHttpResponse(chunks, content_type="application/jsonl; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{kind}.jsonl"'
    response["X-Accel-Buffering"] = "no"
    return response


def health(request: HttpRequest) -> JsonResponse:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
