"""The doors' translations of the kernel's errors (kernel/exceptions.py): the CLI's
CommandError, a form's field errors, and the API's stable error codes. They live here, not
in the kernel, because they name Django's classes or belong to the API's contract; the kernel
imports no Django.

Codes: every refusal of the REST API carries `code`, one of CODES (the OpenAPI Error schema's
enum, apps/runs/api_kit.py), for a client to branch on instead of the words. An error's code
is its nearest class's (`error_code`: TooLarge before InvalidInput); a code is never renamed
or reused, and a new class adds one here. tests/test_error_codes.py shows each one raised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from kernel.exceptions import (
    Conflict,
    InvalidInput,
    NotAllowed,
    NotFound,
    RateLimited,
    RftError,
    TooLarge,
    Unavailable,
    UpstreamFailed,
)

if TYPE_CHECKING:
    from django.forms import BaseForm


def command_error(exc: RftError, *, what: str = "") -> Exception:
    """The CLI's translation: a CommandError (exit status 1) with the message, and one line
    per field when the error names several."""
    from django.core.management.base import CommandError

    head = f"{what}: " if what else ""
    if len(exc.errors) > 1:
        lines = "\n".join(f"  {field or '(all)'}: {message}" for field, message in exc.errors.items())
        return CommandError(f"{head}{len(exc.errors)} problems:\n{lines}")
    return CommandError(f"{head}{exc}")


def form_errors_add(form: BaseForm, exc: RftError) -> None:
    """The forms' translation: each field's message on its form field (the form as a whole
    for a field the form does not have)."""
    for field, message in exc.errors.items():
        form.add_error(field if field in form.fields else None, message)


class Unauthenticated(RftError):
    """No API key, or one that is unknown or revoked (a 401): the REST API's own refusal."""

    status = 401


class MalformedJSON(RftError):
    """A request body that is not JSON at all (a 400; JSON that does not fit is InvalidInput)."""


ErrorCode = Literal[
    "bad_request",
    "malformed_json",
    "unauthenticated",
    "not_allowed",
    "not_found",
    "conflict",
    "too_large",
    "invalid_input",
    "rate_limited",
    "upstream_failed",
    "unavailable",
]
CODES: tuple[ErrorCode, ...] = get_args(ErrorCode)

# Each class's code (RftError's own for an error of no finer class).
CLASS_CODES: dict[type[RftError], ErrorCode] = {
    RftError: "bad_request",
    MalformedJSON: "malformed_json",
    Unauthenticated: "unauthenticated",
    NotAllowed: "not_allowed",
    NotFound: "not_found",
    Conflict: "conflict",
    TooLarge: "too_large",
    InvalidInput: "invalid_input",
    RateLimited: "rate_limited",
    UpstreamFailed: "upstream_failed",
    Unavailable: "unavailable",
}


def error_code(exc: RftError) -> ErrorCode:
    """The stable code of `exc`: its nearest class's, along its class's method resolution order."""
    for cls in type(exc).__mro__:
        if cls in CLASS_CODES:
            return CLASS_CODES[cls]
    return "bad_request"


def status_code(status: int) -> ErrorCode:
    """The code of a refusal with no RftError behind it (one ninja raised), by its status: the
    class's with that status, else bad_request (4xx) or unavailable (5xx)."""
    for error_class, code in CLASS_CODES.items():
        if error_class is not RftError and error_class.status == status:
            return code
    return "unavailable" if status >= 500 else "bad_request"
