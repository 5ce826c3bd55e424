"""Which feedback kinds flag the experience a row of them names, for the buffer's pipeline (the
`human_flagged` filter at claim, the replay priorities' flagged rows).

The kinds are the feedback app's (`FeedbackKind.marks_flagged`), and that app sits above the
buffer (pyproject.toml's layers): the buffer cannot ask its registry, so the feedback app tells
the buffer where to read them when it starts (`flagging_kinds_source`, from its AppConfig.ready).
A new flag-like kind then needs no edit here. Django-free."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class _Source:
    """Where the names come from; none until the feedback app says (then nothing flags)."""

    read: Callable[[], Sequence[str]] = tuple


_SOURCE = _Source()


def flagging_kinds_source(read: Callable[[], Sequence[str]]) -> None:
    """Read the flagging kinds' names through `read` from now on (the feedback app's registry)."""
    _SOURCE.read = read


def flagging_kinds() -> list[str]:
    """The names of the feedback kinds whose rows flag their experience."""
    return list(_SOURCE.read())
