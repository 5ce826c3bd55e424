"""The one error base of rftweb, and its few classes.

Services, selectors and workers raise these; each door translates them in one place:

- the environment API: `rftweb/api.py` `_on_rft_error` answers `status` with
  `{"detail", "errors": {field: message}}` (and Retry-After where one applies);
- the browser views: `rftweb/http.py` `refusals` (a view's refusal rendered as its page shows
  one: plain text, the fragment with the message, the page, a redirect with a message) and
  the forms (`form_errors_add` in rftweb/exceptions.py: each field's message on its form field);
- the CLI: `command_error` (rftweb/exceptions.py), a CommandError with the message and each
  field (exit status 1).

A new failure picks the class that says what the caller can do about it, names the field
it concerns when there is one (a dotted path such as `trajectories.3.logprobs`), and gives
itself a `code` of its own (added to rftweb/exceptions.py CODES, the API's list).
Domain errors that callers catch by name (ConfigInvalid, ImportFailed, ExportFailed,
TransitionNotAllowed, …) are subclasses of these classes, so every door handles them too;
one that code also catches as a builtin (a ValueError inside a pydantic validator, a
RuntimeError at startup) keeps that base beside its class. The few exceptions outside
RftError are not domain errors, each for a reason tests/test_exceptions.py lists.

The pattern is HackSoftware's Django-Styleguide `core/exceptions.py`: one application
error, mapped to a response once per door.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar


class RftError(Exception):
    """Something a caller asked for could not be done; nothing was written.

    `message` is for people; `field` names the input it concerns ("" for the request as a
    whole); `errors` maps every field concerned to its message (one entry unless the
    error names several, as a config with three bad keys does); `status` is the HTTP
    status a door answers with.
    """

    # Each class's own stable code, for a client to branch on (the REST API's `code`, the
    # OpenAPI Error schema's enum: rftweb/exceptions.py CODES). Every class sets its own, once,
    # and keeps it: never renamed nor reused (tests/test_exceptions.py). Its error class's code
    # (the nearest class of this module's) is the API's `error_class`.
    code: ClassVar[str] = "bad_request"

    # A class's status; an error that knows a finer one (the OpenAI door's) sets its own.
    status: int = 400

    def __init__(self, message: str = "", *, field: str = "", errors: Mapping[str, str] | None = None) -> None:
        if errors:
            self._errors = dict(errors)
            field = field or next(iter(self._errors))
            message = message or "; ".join(f"{k}: {v}" if k else v for k, v in self._errors.items())
        else:
            self._errors = {field: message}
        self.message = message
        self.field = field
        super().__init__(f"{field}: {message}" if field and not errors else message)

    def within(self, prefix: str) -> RftError:
        """The same error, its fields placed under `prefix` (a batch's row, a request's
        list): `InvalidInput("…", field="logprobs").within("trajectories.3")` names
        `trajectories.3.logprobs`."""

        def under(name: str) -> str:
            return ".".join(p for p in (prefix, name) if p)

        clone = Exception.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._errors = {under(k): v for k, v in self._errors.items()}
        clone.field = under(self.field)
        clone.args = (f"{clone.field}: {self.message}" if len(self._errors) == 1 else self.message,)
        return clone

    @property
    def errors(self) -> dict[str, str]:
        """field -> message ("" for the request as a whole)."""
        return dict(self._errors)


class InvalidInput(RftError):
    """Malformed input, or input that does not fit what it targets (a 422)."""

    code = "invalid_input"

    status = 422


class TooLarge(InvalidInput):
    """Input past a size limit (a 413)."""

    code = "too_large"

    status = 413


class NotFound(RftError):
    """A named thing does not exist, or is not visible to the caller (a 404)."""

    code = "not_found"

    status = 404


class NotAllowed(RftError):
    """The caller may not do this (a 403)."""

    code = "not_allowed"

    status = 403


class Conflict(RftError):
    """Well-formed, but not possible in the current state: a run transition, a step
    that is already taken (a 409)."""

    code = "conflict"

    status = 409


class RateLimited(RftError):
    """Over a rate limit; `retry_after` seconds until the window ends (a 429)."""

    code = "rate_limited"

    status = 429

    def __init__(self, message: str, *, retry_after: float, field: str = "") -> None:
        super().__init__(message, field=field)
        self.retry_after = retry_after


class Unavailable(RftError):
    """A part the request needs is not reachable now (a worker, the broker, a sync
    channel, a model version not yet published); trying again later can work (a 503)."""

    code = "unavailable"

    status = 503
    retry_after: float | None = 5.0


class UpstreamFailed(RftError):
    """A part the request relied on answered, but with an error or a malformed result (a 502)."""

    code = "upstream_failed"

    status = 502


class ExportFailed(InvalidInput, ValueError):
    """Something cannot be exported as asked: feedback exports (apps/feedback/training_data.py),
    weights and reward models (workers/weights/adapters.py, workers/reward/scorers.py)."""

    code = "export_failed"
