"""The one error base of rftweb, and its few kinds.

Services and selectors raise these; each door translates them in one place: the
environment API (`apps/envapi/api.py`, `_on_rft_error`: `status` + `{"detail", "errors":
{field: message}}`), the browser views (`apps/feedback/views.py` and friends: a 400/403
text or a form error naming the field) and the CLI (`rftweb.exceptions.command_error`, a
CommandError: message and a non-zero exit). A new failure picks the kind that says what
the caller can do about it, and names the field it concerns when there is one.

The pattern is HackSoftware's Django-Styleguide `core/exceptions.py`: one application
error with a message (and here a field), mapped to a response once per door.
"""

from __future__ import annotations

from typing import ClassVar


class RftError(Exception):
    """Something a caller asked for could not be done; nothing was written.

    `message` is for people; `field` names the input it concerns (a dotted path such as
    `trajectories.3.logprobs`, or "" when it concerns the request as a whole); `status` is
    the HTTP status a door answers with.
    """

    status: ClassVar[int] = 400

    def __init__(self, message: str, *, field: str = "") -> None:
        self.message = message
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)

    def within(self, prefix: str) -> RftError:
        """The same error, its field placed under `prefix` (a batch's row, a request's
        list): `InvalidInput("…", field="logprobs").within("trajectories.3")` names
        `trajectories.3.logprobs`."""
        return type(self)(self.message, field=".".join(p for p in (prefix, self.field) if p))

    @property
    def errors(self) -> dict[str, str]:
        """field -> message, the shape the API's 422 answers carry."""
        return {self.field or "body": self.message}


class InvalidInput(RftError):
    """Malformed input, or input that does not fit what it targets (a 422)."""

    status = 422


class NotFound(RftError):
    """A named thing does not exist (or is not visible to the caller)."""

    status = 404


class Conflict(RftError):
    """Well-formed, but not allowed in the current state (a run transition, a step that
    is already taken)."""

    status = 409


class Unavailable(RftError):
    """A part the request needs is not reachable now (a worker, the broker, a sync
    channel); trying again later can work."""

    status = 503


class UpstreamFailed(RftError):
    """A part the request relied on answered, but with an error or a malformed result."""

    status = 502


def command_error(exc: RftError) -> Exception:
    """The CLI's translation: a CommandError carrying the message (exit status 1)."""
    from django.core.management.base import CommandError

    return CommandError(str(exc))
