"""The one REST API, `/api/v1/`: one NinjaAPI, the routers each app contributes mounted on it,
and the API's one translation of errors (kernel.exceptions' RftError, ninja's own).

The routers: the environment API (apps/envapi/api.py: runs, tasks, trajectories, feedback,
rollouts, events, exports), agent sessions (apps/envapi/session_api.py) and the raters
figures (apps/feedback/raters/api.py), the review of labels (apps/feedback/review/api.py) and
blind evaluations (apps/evaluation/api.py). They share apps/runs/api_kit.py (errors, RunId, run
access); authentication is the environment API's keys (apps.envapi.api.KeyAuth).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, NoReturn

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from apps.envapi import api as envapi
from apps.envapi.session_api import router as sessions_router
from apps.evaluation import api as evaluation_api
from apps.feedback.review.api import router as review_router
from apps.feedback.raters.api import router as raters_router
from kernel.exceptions import InvalidInput, RftError, TooLarge, Unavailable
from kernel.input_checks import MAX_DEPTH, InputRejected, tree_check
from rftweb.degrade import POSTGRES_ERRORS, REDIS_ERRORS, RETRY_AFTER_SECONDS, dependency_failed, unavailable_message
from rftweb.exceptions import ErrorClassCode, MalformedJSON, Unauthenticated, error_code, error_class_code, status_code

# ---- errors --------------------------------------------------------------------------


# Values the database could not hold (NUL characters, lone surrogates, NaN, deep nesting)
# are refused by the one input hygiene of every door (kernel/input_checks.py): InputRejected is
# an InvalidInput, a 422 naming the field.


def _reject_constant(name: str) -> NoReturn:
    raise InputRejected("body", f"{name} is not a JSON number")


class SafeJSONParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        body = request.body
        if len(body) > settings.RFT_MAX_BODY_BYTES:
            raise TooLarge(_too_large(), field="body")
        try:
            data = json.loads(body, parse_constant=_reject_constant)
        except RecursionError:
            raise InputRejected("body", f"nested more than {MAX_DEPTH} levels deep") from None
        return tree_check(data)


# The API's own description (its docs page and OpenAPI document).
DESCRIPTION = """The environment REST API, `/api/v1/`.

Authentication: `Authorization: Bearer rft_…`. Scopes: `read` (runs, events, the raters
figures), `submit` (tasks, rollouts, trajectories, sessions), `feedback` (feedback). Errors are
`{"detail", "errors", "field", "code", "error_class"}`: `code` is stable, the error class's own, one of the
Error schema's enum (branch on it, not on the words: `feedback_closed`, `transition_not_allowed`,
`step_conflict`, …), `error_class` the code of its error class, one per status class (`conflict`
for all three; until round 63 `code` held that alone), `field` the input concerned ("" for the request as a
whole), with 401 (no or bad key), 403 (an action outside the key's scopes), 404
(unknown ids, and runs outside the key's runs: the same answer, so run ids cannot be probed),
413 (body past RFT_MAX_BODY_BYTES), 422 (field path -> message), 429 (over the key's rate, with
Retry-After), 503 (no rollout worker answered). None of them writes anything.
"""

api = NinjaAPI(
    title="rftweb environment API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="envapi-v1",
    parser=SafeJSONParser(),
)


def _problem(request: HttpRequest, status: int, detail: str, *, code: str, error_class: ErrorClassCode, field: str = "",
             errors: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> HttpResponse:
    body = {"detail": detail, "errors": errors or {}, "field": field, "code": code, "error_class": error_class}
    response = api.create_response(request, body, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


@api.exception_handler(RftError)
def _on_rft_error(request: HttpRequest, exc: RftError) -> HttpResponse:
    """The API's one translation of the error base (kernel.exceptions): its status and code,
    the fields it names (422: field path -> message), Retry-After where waiting helps."""
    headers: dict[str, str] = {}
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    named = exc.status == 422 or bool(exc.field)
    errors = {field or "body": message for field, message in exc.errors.items()} if named else {}
    return _problem(request, exc.status, str(exc), code=error_code(exc), error_class=error_class_code(exc), field=exc.field,
                    errors=errors, headers=headers)


def _on_dependency_down(request: HttpRequest, exc: Exception) -> HttpResponse:
    """Postgres or Redis unreachable: 503 with Retry-After naming it (rftweb/degrade.py);
    any other database error goes on to Django (a 500)."""
    dependency = dependency_failed(exc)
    if dependency is None:
        raise exc
    down = Unavailable(unavailable_message(dependency))
    down.retry_after = RETRY_AFTER_SECONDS
    return _on_rft_error(request, down)


for _error in (*POSTGRES_ERRORS, *REDIS_ERRORS):
    api.add_exception_handler(_error, _on_dependency_down)  # type: ignore[arg-type]  # ninja types the handler oddly


@api.exception_handler(AuthenticationError)
def _on_unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = _on_rft_error(request, Unauthenticated("missing, unknown or revoked API key; send 'Authorization: Bearer rft_…'"))
    response["WWW-Authenticate"] = "Bearer"
    return response


def _too_large() -> str:
    return f"the request body is larger than {settings.RFT_MAX_BODY_BYTES} bytes"


@api.exception_handler(RequestDataTooBig)
def _on_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return _on_rft_error(request, TooLarge(_too_large()))


@api.exception_handler(HttpError)
def _on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    cause = exc.__cause__
    if isinstance(cause, RftError):  # the body parser's refusals, wrapped by ninja
        return _on_rft_error(request, cause)
    if isinstance(cause, json.JSONDecodeError):
        return _on_rft_error(request, MalformedJSON(f"the body is not valid JSON: {cause.msg} at line {cause.lineno} column {cause.colno}"))
    error_class = status_code(exc.status_code)
    return _problem(request, exc.status_code, str(exc), code=error_class, error_class=error_class)


def _loc(loc: Sequence[object]) -> str:
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[2:] if len(parts) > 1 else []
    elif parts and parts[0] in ("path", "query", "header"):
        parts = parts[1:]
    return ".".join(str(p) for p in parts) or "body"


@api.exception_handler(ValidationError)
def _on_invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors: dict[str, str] = {}
    for err in exc.errors:
        errors.setdefault(_loc(err.get("loc", ())), str(err.get("msg", "invalid")).removeprefix("Value error, "))
    detail = "; ".join(f"{k}: {v}" for k, v in list(errors.items())[:5])
    return _on_rft_error(request, InvalidInput(f"invalid request: {detail}", field=next(iter(errors), ""), errors=errors))


api.add_router("", envapi.router)
api.add_router("/", sessions_router, auth=envapi.SUBMIT)
# The raters figures, under the same keys and errors.
api.add_router("", raters_router, auth=envapi.READ)
# The owner's review of labels (a key with `feedback`, made by the run's owner).
api.add_router("", review_router, auth=envapi.FEEDBACK)
# Blind evaluations under `read` keys; asking, voting and closing also need `feedback`.
api.add_router("", evaluation_api.router, auth=envapi.READ)
