"""One error base: every domain error is an RftError of the kind that says what the caller
can do, and each door turns any of them into its own answer naming the field."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from apps.buffer.importers import ImportFailed
from apps.envapi.services import KeyInvalid
from kernel.config import ConfigInvalid
from apps.feedback.kinds.submit import FeedbackClosed
from apps.runs.services import TransitionNotAllowed
from kernel.exceptions import Conflict, ExportFailed, InvalidInput, RftError, Unavailable
from rftweb.exceptions import command_error
from workers.explore.explorer import GenerateRequestInvalid, VersionNotReady
from workers.weights.sync import SyncUnavailable
from workers.trainer.step import StepConflict


@pytest.mark.parametrize(("error", "kind", "status"), [
    (ConfigInvalid({"sampling.temperature": "must be >= 0"}), InvalidInput, 422),
    (ImportFailed("line 3: not valid JSON"), InvalidInput, 422),
    (ExportFailed("unknown export format 'x'"), InvalidInput, 422),
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


# The exceptions outside RftError, each for a reason: none is a domain error a door answers.
NOT_DOMAIN_ERRORS = {
    # The environments' API client answers its own caller, with httpx alone installed.
    "ApiError": "rftweb/client.py",
    # A BaseException on purpose: the sandbox's per-test alarm must pass through the
    # submitted code's own `except Exception`.
    "_TestTimeout": "apps/rewards/sandbox_runner.py",
    # Stops a process's start (RFT_PLUGINS names a module that cannot be imported): an
    # ImportError, so it reads as one; no door answers it.
    "PluginMissing": "kernel/plugins.py",
    # A learner gang's lost rank, raised and caught inside the train worker (workers/trainer/task.py
    # shows it on the run page and the loop sends the step again): no door answers it.
    "GangLost": "workers/gang_lost.py",
}


def _exception_classes() -> dict[str, list[tuple[str, list[str]]]]:
    """Every class defined in the application (kernel/, apps/, workers/, rftweb/; no migrations):
    name -> [(file, base names)]."""
    root = Path(__file__).resolve().parent.parent
    classes: dict[str, list[tuple[str, list[str]]]] = {}
    for package in ("kernel", "apps", "workers", "rftweb"):
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                             for b in node.bases]
                    classes.setdefault(node.name, []).append((str(path.relative_to(root)), bases))
    builtin = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
               and issubclass(getattr(builtins, n), BaseException)}

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        return name in builtin or (name not in seen and any(
            is_exception(b, seen | {name}) for _, bases in classes.get(name, []) for b in bases))

    return {name: defs for name, defs in classes.items() if is_exception(name)}


def test_every_domain_error_is_an_rft_error_and_each_is_defined_once() -> None:
    classes = _exception_classes()

    def under_rft_error(bases: list[str], seen: frozenset[str] = frozenset()) -> bool:
        return any(b == "RftError" or (b not in seen and any(
            under_rft_error(more, seen | {b}) for _, more in classes.get(b, []))) for b in bases)

    assert {name: [path for path, _ in defs] for name, defs in classes.items() if len(defs) > 1} == {}
    outside = {name: defs[0][0] for name, defs in classes.items()
               if name != "RftError" and not under_rft_error(defs[0][1])}
    assert outside == NOT_DOMAIN_ERRORS


def _own_codes() -> dict[str, list[str]]:
    """Every error class under RftError -> the codes its own body sets (`code = "…"`), read
    from the source of kernel/, apps/, workers/ and rftweb/ (the web cannot import workers/)."""
    root = Path(__file__).resolve().parent.parent
    classes = _exception_classes()
    domain = {name for name in classes if name not in NOT_DOMAIN_ERRORS and name not in dir(builtins)}
    codes: dict[str, list[str]] = {name: [] for name in domain}
    for package in ("kernel", "apps", "workers", "rftweb"):
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.name in codes:
                    for statement in node.body:
                        target = statement.target if isinstance(statement, ast.AnnAssign) else (
                            statement.targets[0] if isinstance(statement, ast.Assign) else None)
                        value = statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign)) else None
                        if isinstance(target, ast.Name) and target.id == "code" and isinstance(value, ast.Constant):
                            codes[node.name].append(str(value.value))
    return codes


def test_every_domain_error_class_has_a_code_of_its_own_that_no_other_class_has() -> None:
    """One code per class, set in the class (FeedbackClosed, StepConflict and TransitionNotAllowed
    each their own; their error class's, `conflict`, is the API's `error_class`): a class that set none would
    answer with its base's code, two classes with one code could not be told apart."""
    codes = _own_codes()
    assert {name for name, own in codes.items() if len(own) != 1} == set()
    by_code: dict[str, list[str]] = {}
    for name, own in codes.items():
        by_code.setdefault(own[0], []).append(name)
    assert {code: names for code, names in by_code.items() if len(names) > 1} == {}


def test_the_api_schema_lists_every_class_code_and_only_those() -> None:
    from rftweb.api import api
    from rftweb.exceptions import CODES, ERROR_CLASS_CODES

    error = api.get_openapi_schema()["components"]["schemas"]["Error"]["properties"]
    assert sorted(error["code"]["enum"]) == sorted(own[0] for own in _own_codes().values())
    assert len(CODES) == len(set(CODES)) and set(ERROR_CLASS_CODES) <= set(CODES)
    assert error["error_class"]["enum"] == list(ERROR_CLASS_CODES)


def test_a_subclass_gets_its_own_code_and_keeps_its_error_class_status() -> None:
    from rftweb.exceptions import error_code, error_class_code

    closed = Exception.__new__(FeedbackClosed)  # its message is read from a run; its code is its class's
    assert (error_code(closed), error_class_code(closed), closed.status) == ("feedback_closed", "conflict", 409)
    step = StepConflict("step 3 was recorded by another trainer")
    assert (error_code(step), error_class_code(step), step.status) == ("step_conflict", "conflict", 409)
    moved = TransitionNotAllowed("cannot pause a run that is paused")
    assert (error_code(moved), error_class_code(moved), moved.status) == ("transition_not_allowed", "conflict", 409)
