"""The doors' translations of the kernel's errors (kernel/exceptions.py) into Django's: the
CLI's CommandError and a form's field errors. They live here, not in the kernel, because they
name Django's classes; the kernel imports no Django."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel.exceptions import RftError

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
