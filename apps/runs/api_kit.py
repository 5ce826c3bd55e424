"""What every router of the one REST API shares (`/api/v1/`, one NinjaAPI assembled in
rftweb/api.py from the routers the apps contribute): the error schema, the errors every
endpoint documents, the run id in a path, and run access.

Run access is `run_reachable`: the one place a router turns a path's run id into a run. A
run the request's key is not scoped to answers 404 exactly like a run that does not exist,
so run ids cannot be enumerated by probing (issue #33). The key's scope is checked first,
with the key itself (`run_scope_check`, from the routes' key auth): a foreign run is 404
before anything of the request is read, never a 422 for its body or query (issue 66).
"""

from __future__ import annotations

from typing import Any, Protocol

from django.http import HttpRequest
from ninja import Schema
from ninja.params.functions import Path
from pydantic import Field

from apps.runs.models import Run
from kernel.exceptions import NotFound
from rftweb.exceptions import CODES, ErrorClassCode


class Error(Schema):
    detail: str = Field(description="what went wrong, in words")
    errors: dict[str, str] = Field(default_factory=dict, description="field path -> message, for 422")
    field: str = Field("", description="the input it concerns, a dotted path; empty for the request as a whole")
    code: str = Field(description="the error class's own stable code: branch on this, not on the words "
                                  "(rftweb/exceptions.py CODES; new codes may be added, none renamed)",
                      json_schema_extra={"enum": list(CODES)})
    error_class: ErrorClassCode = Field(description="the code of the error's class, one per status class (`conflict` "
                                                   "for every state conflict): what `code` held before each error had its own")


# Every endpoint documents its errors (Schemathesis holds the API to it), and every run id in a
# path is one positive 64-bit integer: shared by the API's routers (apps/envapi/api.py, the
# session and raters routers).
ERRORS: dict[int, type] = {400: Error, 401: Error, 403: Error, 404: Error, 413: Error, 422: Error, 429: Error}


def responses(ok: object, *extra: int) -> dict[int, object]:
    """`response=` of a route: `ok` (a schema, a list of one, None) for 200, Error for the rest."""
    out: dict[int, object] = {200: ok, **ERRORS}
    for code in extra:
        out[code] = Error
    return out


RUN_ID_MAX = 2**63 - 1
RunId: int = Path(..., ge=1, le=RUN_ID_MAX, description="the run's id")


class RunScoped(Protocol):
    """What a request authenticated as, as far as run access goes: the runs it may reach
    (apps.envapi.services.KeyPrincipal)."""

    @property
    def run_ids(self) -> frozenset[int]: ...


def run_reachable(request: HttpRequest, run_id: int) -> Run:
    """The run `run_id` when the request's principal may reach it; else NotFound (404), the
    same answer, words and all, for a run outside the key's runs as for a missing one."""
    principal: RunScoped | None = getattr(request, "auth", None)
    run_ids: frozenset[int] = getattr(principal, "run_ids", frozenset())
    run = Run.objects.filter(pk=run_id).first() if run_id in run_ids else None
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


def run_scope_check(request: HttpRequest, principal: RunScoped) -> None:
    """NotFound when the request's path names a run (`run_id`) outside `principal`'s runs.
    Run by the key auth, before the route's body and query are validated: a request about a
    foreign run learns nothing from how its input was judged. A run id that is no run id at
    all (not a number, or outside RunId's range) is left to the route's validation, 422."""
    match = getattr(request, "resolver_match", None)
    raw = match.kwargs.get("run_id") if match is not None else None
    try:
        run_id = int(str(raw)) if raw is not None else None
    except ValueError:
        return
    if run_id is not None and 1 <= run_id <= RUN_ID_MAX and run_id not in principal.run_ids:
        raise NotFound(f"run {run_id} not found")
