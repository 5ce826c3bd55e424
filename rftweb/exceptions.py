"""The doors' translations of the kernel's errors (kernel/exceptions.py): the CLI's
CommandError, a form's field errors, and the API's stable error codes. They live here, not
in the kernel, because they name Django's classes or belong to the API's contract; the kernel
imports no Django.

Codes: every refusal of the REST API carries `code`, its class's own (one of CODES, the OpenAPI
Error schema's enum, apps/runs/api_kit.py), and `error_class`, the code of its nearest error
class (one of ERROR_CLASS_CODES: `conflict` for FeedbackClosed, StepConflict and
TransitionNotAllowed alike), for a client to branch on instead of the words. A code is never renamed or reused;
a new class sets its own and adds it here (tests/test_exceptions.py). tests/test_error_codes.py
shows each code raised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, cast, get_args

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

    code = "unauthenticated"

    status = 401


class MalformedJSON(RftError):
    """A request body that is not JSON at all (a 400; JSON that does not fit is InvalidInput)."""

    code = "malformed_json"


# The error classes' codes: the API's `error_class` of a refusal, the code of its nearest
# error class (the bases of kernel/exceptions.py, and this module's two). Until each class
# had a code of its own (round 63) these were the only codes and `code` held them: a client
# that branched on "conflict" reads `error_class` now. Never renamed.
ErrorClassCode = Literal[
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
ERROR_CLASS_CODES: tuple[ErrorClassCode, ...] = get_args(ErrorClassCode)

# Each error class's code (RftError's own for an error of no finer class): the class's `code`.
CLASS_CODES: dict[type[RftError], ErrorClassCode] = {
    cls: cast(ErrorClassCode, cls.code) for cls in (
        RftError, MalformedJSON, Unauthenticated, NotAllowed, NotFound, Conflict, TooLarge, InvalidInput,
        RateLimited, UpstreamFailed, Unavailable)
}

# Every error class's own code (its `code`, set in the class), the kinds' first: the OpenAPI
# Error schema's enum. The web cannot import the workers' modules, so the list is written
# here; tests/test_exceptions.py holds it to the classes (each code once, each class's here).
CODES: tuple[str, ...] = (
    *ERROR_CLASS_CODES,
    "export_failed",
    # apps/
    "image_rejected",
    "import_failed",
    "session_rejected",
    "openai_error",
    "key_invalid",
    "not_revisable",
    "feedback_closed",
    "invitation_invalid",
    "invitation_gone",
    "transition_not_allowed",
    "run_cannot_start",
    "member_invalid",
    # kernel/ and rftweb/
    "field_conflict",
    "config_invalid",
    "input_rejected",
    "config_error",
    "local_postgres_error",
    "upload_too_large",
    # workers/ (raised and answered inside the workers; listed so that no code is reused)
    "adapter_targets_missing",
    "gang_unsupported",
    "nothing_to_train",
    "trl_api_moved",
    "chat_request_invalid",
    "version_not_ready",
    "generate_request_invalid",
    "demo_build_failed",
    "precision_unsupported",
    "sync_unavailable",
    "sync_failed",
    "step_conflict",
)


def error_code(exc: RftError) -> str:
    """The stable code of `exc`: its class's own (kernel.exceptions.RftError.code)."""
    return type(exc).code


def error_class_code(exc: RftError) -> ErrorClassCode:
    """The code of `exc`'s error class: its nearest one's, along its class's method resolution
    order (TooLarge before InvalidInput)."""
    for cls in type(exc).__mro__:
        if cls in CLASS_CODES:
            return CLASS_CODES[cls]
    return "bad_request"


def status_code(status: int) -> ErrorClassCode:
    """The code (and error class) of a refusal with no RftError behind it (one ninja raised), by
    its status: the error class's with that status, else bad_request (4xx) or unavailable (5xx)."""
    for error_class, code in CLASS_CODES.items():
        if error_class is not RftError and error_class.status == status:
            return code
    return "unavailable" if status >= 500 else "bad_request"
