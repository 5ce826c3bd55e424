"""The runs dashboard: list, creation, the live run page, controls, experience browser,
exports. Thin: parse, call a selector or service, render. Partials serve HTMX and, requested
without HTMX, render as whole pages so every link works without JavaScript."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from django.conf import settings
from django.contrib import messages
from django.db import transaction
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser, User
from django.http import (
    FileResponse,
    Http404,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.buffer.models import Taskset
from apps.buffer.importers import ImportFailed, taskset_import
from apps.buffer.tasks import taskset_import_queued
from apps.buffer.selectors import buffer_counts, experience_filter_choices, experience_filters_parse
from apps.control.forms import (
    CONFIG_FILE,
    FORM,
    algorithm_defaults,
    config_field_specs,
    config_from_post,
    config_warnings,
    errors_by_field,
    feedback_field_specs,
    field_help,
    form_sections,
    values_from_config,
)
from apps.control.bulk_views import bulk_context, filter_fields
from apps.control.presets import PRESETS, preset_get, run_copy_source
from apps.control.selectors import (
    experiences_matching_count,
    RunListQuery,
    experience_group_detail,
    experiences_browse,
    feedback_per_minute,
    whole_group_feedback,
    run_columns,
    run_rows,
    run_waiting,
    tasksets_for,
)
from apps.control.summary import SUMMARY_STATUSES, run_summary
from apps.control.headline import run_headline
from apps.control.twins import run_twin_create, run_twins_start, twin_comparison
from apps.control.versions import BEST_BY_PARAM, versions_panel
from apps.control.weights import weights_download_name, weights_export_request, weights_zip_ready
from apps.feedback.ledger import RunLedger, run_ledger
from apps.feedback.training_data import EXPORT_FILTERS, EXPORT_FORMATS, export_jsonl_response, export_options_parse
from apps.feedback.raters.views import reward_model_panel_context
from apps.feedback.handout.queue import annotation_waiting, labelling_progress
from kernel.input_checks import MAX_CONFIG_BYTES
from kernel.rewards import reward_names
from apps.rewards.selectors import rewards_summary
from apps.runs.access import run_for_page
from kernel.config import ConfigInvalid, RunConfig, config_file_read
from kernel.eval_series import LABELS as EVAL_LABELS
from apps.runs.invitations import invitations_open
from apps.runs.models import Run
from apps.runs.selectors import (
    CHARTS,
    CHART_SECTIONS,
    CONSTANT_PATTERN,
    config_differences,
    metric_series,
    run_audit,
    run_invites_annotation,
    run_may_create,
    run_feedback_closed_why,
    run_state,
    run_takes_feedback,
    run_task_failures,
    runs_to_compare,
    runs_visible_to,
    weight_sync_points,
    weight_sync_timeline,
    workers_visible,
)
from apps.runs.services import (
    MemberInvalid,
    run_create,
    run_feedback_settings_update,
    run_member_add,
    run_member_remove,
    run_name_errors,
    run_spec_check,
    run_transition,
)
from rftweb.degrade import RETRY_AFTER_SECONDS, readiness_checks
from kernel.exceptions import ExportFailed, RftError
from rftweb.http import HtmxHttpRequest, fragment, not_found_first, refusals, refused_as_404, refused_as_text, signed_in


CONTROLS: dict[str, dict[str, str]] = {
    "start": {"label": "Start", "question": "Start run “{name}”? Explorers and trainers begin work."},
    "pause": {"label": "Pause", "question": "Pause run “{name}”? Workers finish their current step and wait."},
    "resume": {"label": "Resume", "question": "Resume run “{name}”?"},
    "stop": {"label": "Stop", "question": "Stop run “{name}”? A stopped run can be started again from the last version."},
}
_ALLOWED: dict[str, list[str]] = {
    Run.Status.DRAFT: ["start"],
    Run.Status.RUNNING: ["pause", "stop"],
    Run.Status.PAUSED: ["resume", "stop"],
    Run.Status.STOPPED: ["start"],
    Run.Status.FAILED: ["start"],
    Run.Status.FINISHED: [],
}


# The run pages read the run's owner and taskset: one query with the run.
_RUNS = Run.objects.select_related("owner", "taskset")


def _partial(request: HtmxHttpRequest, template: str, context: dict[str, object], page_title: str) -> HttpResponse:
    """An HTMX request gets the fragment; a plain one the fragment inside a page."""
    return fragment(request, template, {**context, "page_title": page_title})


# --- list and creation -------------------------------------------------------------------

@login_required
@require_GET
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    query = RunListQuery.parse(request.GET)
    context = {"rows": run_rows(user=request.user, query=query), "may_create": run_may_create(user=request.user),
               "query": query, "columns": run_columns(query), "statuses": Run.Status.values,
               "here": request.path + (f"?{query.params()}" if query.params() else "")}
    if request.htmx and request.htmx.target == "runs":
        return render(request, "runs/_run_rows.html", context)
    if request.htmx and request.htmx.target == "runs-table":
        return render(request, "runs/_run_table.html", context)
    return render(request, "runs/list.html", context)


def _create_context(values: dict[str, str], errors: dict[str, list[str]], name: str = "", *, user: User | AnonymousUser | None = None,
                    taskset_id: int | None = None, notes: list[str] | None = None, chosen: str = "") -> dict[str, object]:
    specs = config_field_specs()
    for spec in specs:
        spec.value = values.get(spec.path, spec.default)
        spec.errors = errors.get(spec.path, [])
        spec.help = field_help(spec.path, spec.help)
    return {
        "sections": form_sections(specs, errors),
        "errors": errors,
        # Errors no field shows (the form as a whole, a key the form lacks): listed on top.
        "form_errors": errors.get(FORM, []),
        "error_count": sum(len(v) for v in errors.values()),
        "name": name,
        "reward_names": _reward_names(),
        "tasksets": tasksets_for(user=user) if user is not None else [],
        "taskset_id": taskset_id,
        "notes": notes or [],
        "algorithm_defaults": algorithm_defaults(),
        "presets": PRESETS,
        "chosen": chosen,
        "copyable": list(runs_visible_to(user=user).order_by("-created_at").values("pk", "name")[:50]) if user else [],
    }


def _run_new_get(request: HtmxHttpRequest) -> HttpResponse:
    """The empty form, or filled from a preset (`?preset=grpo-math`) or another run
    (`?from=12`): plain links, so they work without JavaScript."""
    specs = config_field_specs()
    slug, source = request.GET.get("preset", ""), request.GET.get("from", "")
    if slug:
        preset = preset_get(slug)
        if preset is None:
            return render(request, "runs/new.html", _create_context(
                {}, {FORM: [f"no preset {slug!r}; pick one of the list"]}, user=request.user), status=404)
        note = f"Filled in from “{preset.title}”. Name your model and a taskset, check the rest, then create."
        return render(request, "runs/new.html", _create_context(
            values_from_config(preset.config, specs), {}, user=request.user, notes=[note], chosen=preset.slug))
    if source:
        copy = run_copy_source(user=request.user, run_id=source)
        if copy is None:
            return render(request, "runs/new.html", _create_context(
                {}, {FORM: [f"no run #{source} that you may see to copy from"]}, user=request.user), status=404)
        note = f"Copied from run “{copy.run.name}” (#{copy.run.pk}): change what should differ, then create."
        return render(request, "runs/new.html", _create_context(
            values_from_config(copy.config, specs), {}, copy.name, user=request.user, notes=[note],
            taskset_id=copy.taskset_id, chosen=f"run-{copy.run.pk}"))
    return render(request, "runs/new.html", _create_context({}, {}, user=request.user))


def _reward_names() -> list[str]:
    return sorted(reward_names())


def _taskset_from_request(request: HtmxHttpRequest) -> tuple[Taskset | None, list[str], list[str]]:
    """The taskset the form names: an upload (imported in the form's transaction, gone
    again if the form is refused) or one picked from the list. (taskset or None, errors,
    notes)."""
    upload = request.FILES.get("taskset")
    if upload is not None:
        suffix = Path(upload.name or "").suffix.lower()
        if suffix not in {".jsonl", ".ndjson", ".parquet", ".pq", ".zip"}:
            return None, [f"{upload.name}: upload a .jsonl, .parquet or .zip (JSONL with its pictures) file"], []
        if upload.size is not None and upload.size > settings.RFT_UPLOAD_BACKGROUND_BYTES:
            # Large: stored, and imported by a Celery task once the run is created (the
            # enqueue waits for the commit; a refused form removes the file, _run_new_post).
            uploads = Path(settings.RFT_STORAGE_DIR) / "uploads"
            uploads.mkdir(parents=True, exist_ok=True)
            stored = uploads / f"{uuid.uuid4().hex}{suffix}"
            with stored.open("wb") as fh:
                for chunk in upload.chunks():
                    fh.write(chunk)
            owner = request.user if isinstance(request.user, User) else None  # login_required: always a User
            taskset = taskset_import_queued(name=Path(upload.name or "taskset").stem, stored=stored, owner=owner)
            return taskset, [], [f"Taskset “{taskset.name}” is imported in the background; the run page shows "
                                 "its progress."]
        try:
            with tempfile.NamedTemporaryFile(suffix=suffix) as tmp:
                for chunk in upload.chunks():
                    tmp.write(chunk)
                tmp.flush()
                taskset = taskset_import(name=Path(upload.name or "taskset").stem, path=tmp.name, owner=request.user)
        except ImportFailed as exc:
            return None, [str(exc)], []  # names the bad line
        return taskset, [], [f"Taskset “{taskset.name}” ({taskset.tasks.count()} tasks) was imported and is selected below."]
    raw = (request.POST.get("taskset_id") or "").strip()
    if not raw:
        return None, [], []
    chosen = next((t for t in tasksets_for(user=request.user) if str(t.pk) == raw), None)
    if chosen is None:
        return None, [f"no taskset #{raw} that you may use"], []
    return chosen, [], []


class _Refused(NamedTuple):
    """A run form that created nothing: what the page shows again."""

    values: dict[str, str]
    errors: dict[str, list[str]]
    name: str
    taskset_id: int | None
    notes: list[str]


@login_required
@require_http_methods(["GET", "POST"])
def run_new(request: HtmxHttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _run_new_get(request)
    # One transaction: a refused form leaves nothing behind, an uploaded taskset included
    # (issue #33: a refused 50 MB upload left 54,557 tasks). The page is drawn after the
    # rollback, so its picker lists only what stays.
    with transaction.atomic():
        outcome = _run_new_post(request)
        if isinstance(outcome, _Refused):
            transaction.set_rollback(True)
    if isinstance(outcome, _Refused):
        return render(request, "runs/new.html", _create_context(
            outcome.values, outcome.errors, outcome.name, user=request.user, taskset_id=outcome.taskset_id,
            notes=outcome.notes), status=400)
    return outcome


def _run_new_post(request: HtmxHttpRequest) -> HttpResponse | _Refused:
    specs = config_field_specs()
    name = request.POST.get("name", "").strip()
    upload = request.FILES.get(CONFIG_FILE)
    errors: dict[str, list[str]] = {}
    data: Mapping[str, object] | None = None
    if upload is not None:
        # The file is the config; its values fill the form so each error sits beside its field.
        raw = upload.read(MAX_CONFIG_BYTES + 1)
        filename = upload.name or "config.yaml"
        fallback = CONFIG_FILE
        try:
            read = config_file_read(data=raw, filename=filename)
        except ConfigInvalid as exc:
            errors = errors_by_field(exc.errors, specs, fallback=CONFIG_FILE)
        else:
            data = read if isinstance(read, dict) else None
            if data is None:
                errors = {CONFIG_FILE: ["a run config must be a mapping of keys to values"]}
        values = values_from_config(data, specs) if data is not None else {}
    else:
        fallback = FORM
        data, read_errors = config_from_post(request.POST, specs)
        values = {k: str(v) for k, v in request.POST.items() if k in {s.path for s in specs}}
        errors = errors_by_field(read_errors, specs) if read_errors else {}
    # Every problem on the first submit: the name, the taskset, each field that could not be
    # read (bad YAML), and the rest of the config validated without those (a negative
    # learning rate), the model directory checked beside it (a missing tokenizer).
    for message in run_name_errors(name=name).values():
        errors.setdefault("name", []).append(message)
    taskset, taskset_errors, notes = _taskset_from_request(request)
    if taskset_errors:
        errors.setdefault("taskset", []).extend(taskset_errors)
    taskset_id = taskset.pk if taskset is not None else None
    unreadable = set(errors)
    cfg: RunConfig | None = None
    if data is not None:
        # Validated once: what validates here is what run_create stores.
        cfg, spec_errors = run_spec_check(config=data, taskset=taskset)
        for field_path, messages_ in errors_by_field(spec_errors, specs, fallback=fallback).items():
            if field_path in unreadable and field_path not in ("name", "taskset", FORM):
                continue  # its own message (the YAML that did not parse) says it already
            errors.setdefault(field_path, []).extend(m for m in messages_ if m not in errors.get(field_path, []))
    run: Run | None = None
    if not errors and data is not None:
        try:
            run = run_create(name=name, owner=signed_in(request), config=cfg if cfg is not None else data, taskset=taskset)
        except ConfigInvalid as exc:
            errors = errors_by_field(exc.errors, specs, fallback=fallback)
    if errors or run is None:
        upload = request.FILES.get("taskset")
        if upload is not None and taskset is not None and taskset.import_status != Taskset.Import.READY:
            # Its row goes with the rollback, its stored file here; nothing was enqueued.
            Path(taskset.source).unlink(missing_ok=True)
            notes = [f"“{upload.name}” was not kept, as the run was not created: fix the errors below and "
                     "choose the file again."]
            taskset_id = None
        elif upload is not None and taskset is not None:
            # Rolled back with the rest: the picker cannot offer it, the file must come again.
            notes = [f"“{upload.name}” ({taskset.tasks.count()} tasks) was read but not kept, as the run was not "
                     "created: fix the errors below and choose the file again."]
            taskset_id = None
        return _Refused(values, errors, name, taskset_id, notes)
    messages.success(request, f"Run “{run.name}” created as a draft.")
    for warning in config_warnings(config=run.cfg):
        messages.warning(request, warning)
    return redirect("runs:detail", run_id=run.pk)


# --- the run page ------------------------------------------------------------------------

def _controls_context(run: Run, role: str) -> dict[str, object]:
    actions = _ALLOWED.get(run.status, []) if role == "owner" else []
    return {
        "run": run,
        "role": role,
        "controls": [{"action": a, **CONTROLS[a], "question": CONTROLS[a]["question"].format(name=run.name)} for a in actions],
    }


def _feedback_form_context(run: Run, values: dict[str, str] | None = None, errors: dict[str, list[str]] | None = None) -> dict[str, object]:
    specs = feedback_field_specs()
    current = values_from_config(run.config, specs)
    for spec in specs:
        spec.value = (values or current).get(spec.path, spec.default)
        spec.errors = (errors or {}).get(spec.path, [])
    return {"feedback_fields": specs, "feedback_errors": (errors or {}).get("feedback", []) + (errors or {}).get(FORM, [])}


@login_required
@require_GET
def run_detail(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    counts, timeline = buffer_counts(run=run), weight_sync_timeline(run=run)  # shown twice: read once
    twin = twin_comparison(run=run, user=request.user)
    versions = versions_panel(run=run, picked=request.GET.get(BEST_BY_PARAM))
    context = {
        **_controls_context(run, role),
        **_feedback_form_context(run),
        "cfg": run.cfg,
        "counts": counts,
        "timeline": timeline,
        # A failed sync opens the versions' table, where it is said (closed, it would hide it).
        "timeline_failed": any(v["failures"] for v in timeline),
        "workers": workers_visible(user=request.user, run=run),
        "audit": run_audit(run=run, limit=20),
        "failures": run_task_failures(run=run),
        "waiting": run_waiting(run=run),
        "warnings": config_warnings(config=run.cfg),
        # "Annotate" only where people's labels still count; an ended run shows its summary.
        "invites_annotation": run_invites_annotation(run=run),
        "annotation_waiting": annotation_waiting(run=run, annotator=request.user)
                              if role in ("owner", "annotator") and run_takes_feedback(run=run) else 0,
        "takes_feedback": run_takes_feedback(run=run),
        "summary": run_summary(run=run),
        # Where the labels went while the run goes on (once it ends, its summary shows it).
        "run_ledger": _ledger_of(run),
        **_members_context(run, role),
        "invitations": invitations_open(run=run) if role == "owner" else [],
        "labelling": labelling_progress(run=run) if role == "owner" else None,
        "demo_annotator": _demo_annotator(run),
        "chart_data": {
            "charts": CHARTS,
            "sections": CHART_SECTIONS,
            "constant_pattern": CONSTANT_PATTERN,
            # Legends name a series by what it measures (kernel/eval_series.py).
            "labels": EVAL_LABELS,
            "compare": runs_to_compare(user=request.user, run=run),
            "run": {"id": run.pk, "name": run.name, **run_state(run=run)},
            "series": metric_series(run=run),
            "feedback": _feedback_chart(run),
            "counts": counts,
            "sync": weight_sync_points(run=run, timeline=timeline),
        },
        "export_formats": EXPORT_FORMATS,
        **reward_model_panel_context(run=run, role=role),
        "rewards": rewards_summary(run=run),
        "eval_best": versions.best,
        # Beside its twin (the run copied with people's feedback off): what people taught.
        "twin": twin,
        # What people teach, before the raw series; every version, the best by the owner's pick.
        "headline": run_headline(run=run, twin=twin),
        "versions": versions,
    }
    return render(request, "runs/detail.html", context, status=400 if versions.error else 200)


def _summary_partial(request: HtmxHttpRequest, run: Run, *, weights_error: str = "", status: int = 200) -> HttpResponse:
    versions = versions_panel(run=run, picked=request.GET.get(BEST_BY_PARAM) or request.POST.get(BEST_BY_PARAM))
    context = {"run": run, "summary": run_summary(run=run), "export_formats": EXPORT_FORMATS, "weights_error": weights_error,
               "twin": twin_comparison(run=run, user=request.user), "versions": versions}
    if context["summary"] is None:
        # Not ended (yet): the run page says where it stands.
        if request.htmx:
            return HttpResponse('<section id="summary" hidden></section>')
        return redirect("runs:detail", run_id=run.pk)
    return fragment(request, "runs/_summary.html", {**context, "page_title": f"Summary · {run.name}"}, status=status)


@login_required
@require_GET
def run_config_diff(request: HtmxHttpRequest, run_id: int, other_id: int | None = None) -> HttpResponse:
    """The config keys two runs differ in (dotted paths, both values): /runs/<id>/diff/<other>/,
    or ?with=<other> from the run page's picker. A run one may not see is a 404, either side."""
    run, _role = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    raw = request.GET.get("with", "")
    error = ""
    if other_id is None and raw:
        if not (raw.strip().isascii() and raw.strip().isdigit()) or len(raw.strip()) > 18:
            error = f"“with” must be a run number, not {raw[:50]!r}"
        else:
            other_id = int(raw)
    other = run_for_page(user=request.user, run_id=other_id, runs=_RUNS)[0] if other_id is not None else None
    context = {
        "run": run, "other": other, "error": error,
        # Each key with its dotted parts: a narrow column breaks it between parts, never inside one.
        "differences": [(d, [f"{part}." for part in d["path"].split(".")[:-1]] + [d["path"].split(".")[-1]])
                        for d in config_differences(run.config, other.config)] if other is not None else [],
        "choices": runs_visible_to(user=request.user).exclude(pk=run.pk).order_by("-created_at")
                   .values("pk", "name", "status")[:100],
    }
    return render(request, "runs/diff.html", context, status=400 if error else 200)


@login_required
@require_GET
def run_summary_view(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    return _summary_partial(request, run)


def _versions_partial(request: HtmxHttpRequest, run: Run, *, weights_error: str = "", status: int = 200) -> HttpResponse:
    """The run page's (and summary's) versions panel, the best by the `best_by` picked there."""
    versions = versions_panel(run=run, picked=request.GET.get(BEST_BY_PARAM) or request.POST.get(BEST_BY_PARAM))
    if weights_error:
        versions = replace(versions, error=weights_error)
    status = 400 if versions.error and status == 200 else status
    context = {"run": run, "versions": versions, "page_title": f"Versions · {run.name}"}
    return fragment(request, "runs/_versions.html", context, status=status, htmx_status=200 if versions.error else status)


@login_required
@require_GET
def run_headline_view(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """The run page's headline alone: the page swaps it in when an evaluation lands."""
    run, role = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    context = {"run": run, "role": role, "headline": run_headline(run=run, twin=twin_comparison(run=run, user=request.user))}
    return _partial(request, "runs/_headline.html", context, f"Headline · {run.name}")


@login_required
@require_GET
def run_versions(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """Every published version and the best by ?best_by= (one of the run's evaluation series)."""
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    return _versions_partial(request, run)


def _weights_refused(request: HtmxHttpRequest, error: RftError, run_id: int, **_: object) -> HttpResponse:
    """A version that cannot be packed: the panel the form was in says why."""
    run, _role = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    if request.POST.get("panel") == "versions":
        return _versions_partial(request, run, weights_error=error.message, status=error.status)
    return _summary_partial(request, run, weights_error=error.message, status=200 if request.htmx else error.status)


@login_required
@require_POST
@refusals(not_found_first(_weights_refused))
def run_weights_prepare(request: HtmxHttpRequest, run_id: int, version: int) -> HttpResponse:
    """A member asks for a version's weights as a .zip: a train worker packs it (see
    apps/control/weights.py); the summary, or the versions panel the form was in
    (panel=versions), shows it queued, packing, then the link."""
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    in_panel = request.POST.get("panel") == "versions"
    weights_export_request(run=run, version=version)
    if not request.htmx:
        return redirect(f"{reverse('runs:detail', kwargs={'run_id': run.pk})}#{'versions' if in_panel else 'summary'}")
    return _versions_partial(request, run) if in_panel else _summary_partial(request, run)


@login_required
@require_GET
@refusals(not_found_first(refused_as_text))
def run_weights_download(request: HtmxHttpRequest, run_id: int, version: int) -> HttpResponseBase:
    """The packed zip of a version's weights, for the run's members."""
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    path = weights_zip_ready(run=run, version=version)
    return FileResponse(path.open("rb"), as_attachment=True, filename=weights_download_name(run_id=run.pk, version=version),
                        content_type="application/zip")


def _feedback_chart(run: Run) -> list[list[float]] | None:
    """The feedback-per-minute points, or None for a twin: it takes no labels by construction,
    so its page draws no (always empty) feedback chart."""
    return None if run.twin_of_id is not None else feedback_per_minute(run=run)


@login_required
@require_GET
def run_metrics(request: HtmxHttpRequest, run_id: int) -> JsonResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    state = run_state(run=run)
    if request.GET.get("only") == "counts":
        return JsonResponse({"counts": buffer_counts(run=run), "status": run.status, "run": state})
    if request.GET.get("only") == "sync":
        return JsonResponse({"sync": weight_sync_points(run=run)})
    return JsonResponse({"series": metric_series(run=run), "feedback": _feedback_chart(run),
                         "counts": buffer_counts(run=run), "status": run.status, "run": state})


@login_required
@require_GET
def run_controls(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    return _partial(request, "runs/_controls.html", _controls_context(run, role), f"Controls · {run.name}")


def _control_refused(request: HtmxHttpRequest, error: RftError, run_id: int, action: str) -> HttpResponse:
    """A transition the run's status does not allow: the controls again with the message (a 200:
    HTMX swaps only 2xx), or the run page with it."""
    if request.htmx:
        run, role = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
        return render(request, "runs/_controls.html", {**_controls_context(run, role), "error": error.message})
    messages.error(request, error.message)
    return redirect("runs:detail", run_id=run_id)


@login_required
@require_http_methods(["GET", "POST"])
@refusals(_control_refused)
def run_control(request: HtmxHttpRequest, run_id: int, action: str) -> HttpResponse:
    """GET: a confirmation page (the no-JavaScript path). POST with confirm=yes: do it."""
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    if action not in CONTROLS:
        raise Http404("no such action")
    question = CONTROLS[action]["question"].format(name=run.name)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        return render(request, "runs/confirm.html", {"run": run, "action": action, "label": CONTROLS[action]["label"],
                                                      "question": question})
    run = run_transition(run=run, action=action, actor=request.user)
    if action == "start":  # a twin made before its run started starts with it
        run_twins_start(run=run, actor=request.user if isinstance(request.user, User) else None)
    if request.htmx:
        return render(request, "runs/_controls.html", {**_controls_context(run, role), "error": ""})
    messages.success(request, f"{CONTROLS[action]['label']}: run is now {run.status}.")
    return redirect("runs:detail", run_id=run.pk)


@login_required
@require_http_methods(["GET", "POST"])
def run_twin(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """GET: what a twin is, and a button. POST: make the run's twin (its config and taskset,
    nobody rating it, apps/control/twins.py) and go to it; both run pages then show the
    comparison once both have evaluated."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    if request.method == "GET":
        return render(request, "runs/twin.html", {"run": run})
    twin = run_twin_create(run=run, actor=request.user if isinstance(request.user, User) else None)
    when = (f"it starts when you start {run.name}" if run.status == Run.Status.DRAFT
            else "start it now, so that both runs train over the same time")
    messages.success(request, f"{twin.name} is {run.name} with people's feedback off: it takes no labels; {when}.")
    return redirect("runs:detail", run_id=twin.pk)


@login_required
@require_POST
def run_feedback_settings(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    specs = feedback_field_specs()
    values = {k: str(v) for k, v in request.POST.items() if k in {s.path for s in specs}}
    errors: dict[str, list[str]] = {}
    if run.twin_of_id is not None:
        errors = {FORM: [f"{run_feedback_closed_why(run=run)}: its feedback settings stay off"]}
    elif request.POST.get("confirm") != "yes":
        errors = {FORM: ["tick the box to confirm the change of settings"]}
    else:
        data, read_errors = config_from_post(request.POST, specs)
        if read_errors:
            errors = errors_by_field(read_errors, specs)
        else:
            try:
                run = run_feedback_settings_update(run=run, feedback=data.get("feedback", {}), actor=request.user)
            except ConfigInvalid as exc:
                errors = errors_by_field(exc.errors, specs)
    context = {"run": run, "role": role, **_feedback_form_context(run, values if errors else None, errors),
               "saved": not errors}
    if request.htmx:
        return render(request, "runs/_feedback_settings.html", context)
    if errors:
        return _partial(request, "runs/_feedback_settings.html", context, f"Feedback settings · {run.name}")
    messages.success(request, "Feedback settings updated.")
    return redirect("runs:detail", run_id=run.pk)


@login_required
def run_feedback_settings_moved(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """The settings' old path: a permanent redirect that keeps the method (308), so a form
    open in an old tab still posts its change. Only for the run's owner: to anyone else the
    old path is a missing page, as every page of a run they may not change is (a redirect
    for every id would tell nothing, but would be the one run page that is not a 404)."""
    run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    return redirect("runs:feedback_settings", run_id=run_id, permanent=True, preserve_request=True)


def _run_panel(template: str, title: str,
               context: Callable[[Run], dict[str, object]]) -> Callable[[HtmxHttpRequest, int], HttpResponse]:
    """A read-only panel of the run page for any member (GET): `template` given the run and
    `context(run)`, a page of its own titled "<title> · <run>" when not asked for by htmx."""

    @login_required
    @require_GET
    def panel(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
        run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
        return _partial(request, template, {"run": run, **context(run)}, f"{title} · {run.name}")

    return panel


run_timeline = _run_panel("runs/_timeline.html", "Weight sync", lambda run: {"timeline": weight_sync_timeline(run=run)})
run_audit_log = _run_panel("runs/_audit.html", "Audit", lambda run: {"audit": run_audit(run=run, limit=200)})
# "Where the labels went", asked for again on the events that move a label's state.
run_ledger_view = _run_panel("runs/_ledger.html", "Where the labels went", lambda run: {"run_ledger": _ledger_of(run)})


def _ledger_of(run: Run) -> RunLedger | None:
    """The run page's ledger while the run goes on (once it ends, its summary shows it); none
    for a twin, which takes no labels."""
    return run_ledger(run=run) if run.status not in SUMMARY_STATUSES and run.twin_of_id is None else None


def _members_context(run: Run, role: str, **extra: object) -> dict[str, object]:
    return {"run": run, "role": role, "members": list(run.members.select_related("user").order_by("role", "user__username")),
            **extra}


def _demo_annotator(run: Run) -> str:
    """The annotator account to suggest in the human-loop hint: the run's first annotator."""
    member = run.members.filter(role="annotator").select_related("user").order_by("id").first()
    return member.user.get_username() if member else ""


@login_required
@require_http_methods(["GET", "POST"])
def run_members(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """GET: the run's people. POST (owner): add a person by username, or change their role."""
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner" if request.method == "POST" else "view", runs=_RUNS)
    if request.method == "GET":
        return _partial(request, "runs/_members.html", _members_context(run, role), f"People · {run.name}")
    values = {"username": request.POST.get("username", ""), "role": request.POST.get("role", "annotator")}
    try:
        member = run_member_add(run=run, username=values["username"], role=values["role"], actor=request.user)
    except MemberInvalid as exc:
        context = _members_context(run, role, member_errors={exc.field: [exc.message]}, member_values=values)
        return _partial(request, "runs/_members.html", context, f"People · {run.name}")
    saved = f"{member.user.get_username()} is now {member.role} of this run."
    if request.htmx:
        return render(request, "runs/_members.html", _members_context(run, role, member_saved=saved))
    messages.success(request, saved)
    return redirect("runs:detail", run_id=run.pk)


@login_required
@require_POST
@refusals(refused_as_404)
def run_member_delete(request: HtmxHttpRequest, run_id: int, member_id: int) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    run_member_remove(run=run, member_id=member_id, actor=request.user)
    if request.htmx:
        return render(request, "runs/_members.html", _members_context(run, role))
    messages.success(request, "Removed.")
    return redirect("runs:detail", run_id=run.pk)


@login_required
@require_GET
def run_waiting_view(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """What the run waits for (the run page polls it and asks again on its events) and, out of
    band for a person who may annotate it, the Annotate button's "N waiting", so both move."""
    run, role = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    badge = (annotation_waiting(run=run, annotator=request.user)
             if request.htmx and role in ("owner", "annotator") and run_invites_annotation(run=run) else None)
    return _partial(request, "runs/_waiting.html", {"run": run, "waiting": run_waiting(run=run), "badge": badge},
                    f"Waiting · {run.name}")


@login_required
@require_GET
def run_labelling(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    """The owner's "Labelling progress" panel, which the run page asks for again after each
    label (feedback.saved) and as rollouts arrive: the figures as the rows give them now."""
    run, _ = run_for_page(user=request.user, run_id=run_id, need="owner", runs=_RUNS)
    return _partial(request, "runs/_labelling.html", {"run": run, "labelling": labelling_progress(run=run)},
                    f"Labelling progress · {run.name}")
# The run's taskset import progress (polled by the run page while it goes on).
run_taskset_import = _run_panel("runs/_taskset_import.html", "Taskset import", lambda run: {"just_done": True})
run_failures = _run_panel("runs/_failures.html", "Worker errors", lambda run: {"failures": run_task_failures(run=run)})


@login_required
@require_GET
def worker_health(request: HtmxHttpRequest) -> HttpResponse:
    return _partial(request, "runs/_workers.html", {"workers": workers_visible(user=request.user)}, "Workers")


# --- experiences ---------------------------------------------------------------------------

@login_required
@require_GET
def experience_list(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, role = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
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
        # Back to the first page, the filters and the search kept (None on the first page).
        "first_query": filters.query(before=None) if filters.before is not None else None,
        # The bulk bar: the actions this person's role allows, and what "all matching" means.
        **bulk_context(run=run, role=role),
        "matching": 0 if filters.errors else experiences_matching_count(run=run, filters=filters),
        "filter_fields": [] if filters.errors else filter_fields(filters.query(before=None)),
    }
    if request.htmx and request.htmx.target == "experience-results":
        # The filters stay as typed; each one's error slot is refreshed beside it (out of band).
        slots = [(f"e-{name.replace('_', '-')}", filters.errors.get(name, ""))
                 for name in ("status", "reward_min", "reward_max", "version", "flagged")]
        return render(request, "runs/_experience_results.html", {**context, "error_slots": slots})
    return render(request, "runs/experiences.html", context, status=400 if filters.errors else 200)


@login_required
@require_GET
def experience_group(request: HtmxHttpRequest, run_id: int, group_id: str) -> HttpResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    members = experience_group_detail(run=run, group_id=group_id)
    if not members:
        raise Http404("no such group")
    return _partial(request, "runs/_group.html",
                    {"run": run, "group_id": group_id, "members": members,
                     "whole_group_feedback": whole_group_feedback(run=run, group_id=group_id)},
                    f"Group {group_id} · {run.name}")


# --- exports -------------------------------------------------------------------------------

@login_required
@require_GET
def export_page(request: HtmxHttpRequest, run_id: int) -> HttpResponse:
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    return render(request, "runs/export.html", {"run": run, "formats": EXPORT_FORMATS})


@login_required
@require_GET
def export_download(request: HtmxHttpRequest, run_id: int, export_format: str) -> HttpResponseBase:
    run, _ = run_for_page(user=request.user, run_id=run_id, runs=_RUNS)
    try:
        return export_jsonl_response(run=run, export_format=export_format, options=export_options_parse(request.GET))
    except ExportFailed as exc:
        # The export page again, the refused value kept and the error beside its field.
        field = exc.field if exc.field in EXPORT_FILTERS else ""
        return render(request, "runs/export.html", {
            "run": run, "formats": EXPORT_FORMATS, "error_format": export_format, "error_field": field, "error": exc.message,
            "values": {k: request.GET.get(k, "") for k in EXPORT_FILTERS},
        }, status=400)


def health(request: HtmxHttpRequest) -> JsonResponse:
    """Liveness: the process answers. No dependency is asked (that is /ready/): a database
    outage must not get healthy web processes restarted."""
    return JsonResponse({"ok": True})


def ready(request: HtmxHttpRequest) -> JsonResponse:
    """Readiness for a load balancer: each dependency "ok" or why it is not; 503 naming
    those down when any is (Redis "unused" in the embedded default)."""
    checks = readiness_checks()
    names = {"database": "Postgres", "redis": "Redis"}
    down = [names[name] for name, state in checks.items() if state not in {"ok", "unused"}]
    body: dict[str, object] = {"ok": not down, **checks}
    if down:
        body["down"] = down
    response = JsonResponse(body, status=503 if down else 200)
    if down:
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response
