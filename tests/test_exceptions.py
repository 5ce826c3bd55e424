"""One error base: every domain error is an RftError of the kind that says what the caller
can do, and each door turns any of them into its own answer naming the field."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from apps.feedback.exports import ExportFailed
from apps.buffer.importers import ImportFailed
from apps.envapi.services import KeyInvalid
from apps.runs.config import ConfigInvalid
from apps.runs.services import TransitionNotAllowed
from rftweb.exceptions import Conflict, InvalidInput, RftError, Unavailable, command_error
from workers.explorer import GenerateRequestInvalid, VersionNotReady
from workers.sync import SyncUnavailable
from workers.trainer import StepConflict


@pytest.mark.parametrize(("error", "kind", "status"), [
    (ConfigInvalid({"sampling.temperature": "must be >= 0"}), InvalidInput, 422),
    (ImportFailed("line 3: not valid JSON"), InvalidInput, 422),
    (ExportFailed("unknown export kind 'x'"), InvalidInput, 422),
    (KeyInvalid({"name": "a key needs a name"}), InvalidInput, 422),
    (GenerateRequestInvalid("requests.0: expected an object"), InvalidInput, 422),
    (TransitionNotAllowed("cannot pause a run that is paused"), Conflict, 409),
    (StepConflict("step 3 was recorded by another trainer"), Conflict, 409),
    (SyncUnavailable("NCCL needs CUDA"), Unavailable, 503),
    (VersionNotReady("version 4 is not published yet"), Unavailable, 503),
])
def test_every_domain_error_is_one_kind_of_the_base(error: RftError, kind: type, status: int) -> None:
    assert isinstance(error, kind) and isinstance(error, RftError) and error.status == status
    assert error.message and error.errors


def test_an_import_error_names_where_it_happened_as_its_field() -> None:
    error = ImportFailed("line 3: not valid JSON (Expecting value at column 1)")
    assert (error.field, error.message) == ("line 3", "not valid JSON (Expecting value at column 1)")
    assert str(error) == "line 3: not valid JSON (Expecting value at column 1)"


def test_an_error_inside_a_batch_names_its_row() -> None:
    error = InvalidInput("logprobs has 1 entries for 2 response tokens", field="logprobs").within("trajectories.3")
    assert type(error) is InvalidInput
    assert error.errors == {"trajectories.3.logprobs": "logprobs has 1 entries for 2 response tokens"}


def test_the_cli_gives_one_line_per_field_and_exits_non_zero() -> None:
    one = command_error(InvalidInput("must be >= 0", field="sampling.temperature"))
    several = command_error(ConfigInvalid({"model": "required", "sampling.top_p": "must be in (0, 1]"}))
    assert isinstance(one, CommandError) and str(one) == "sampling.temperature: must be >= 0"
    assert str(several) == "2 problems:\n  model: required\n  sampling.top_p: must be in (0, 1]"
