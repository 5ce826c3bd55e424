"""Input hygiene: one set of checks for every door (forms, config files, the CLI, taskset
imports, the environment API, the typed experience).

What Postgres cannot hold is refused here, naming the field or line, instead of failing
as a 500 or a traceback at the database write: NUL characters and lone surrogates in text
(`text` and `jsonb` reject both), non-finite numbers (`jsonb` has no NaN or infinity),
and trees nested deeper than a bound (Python's recursion limit). Text arrives decoded
strictly as UTF-8, YAML is parsed safely with aliases refused (the billion-laughs
expansion), and booleans are never taken for numbers (`True == 1` in Python).

Pure: no Django model imports, so the API's schemas, the run config and the buffer's
typed rows can all use it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Annotated, NoReturn, TypeVar

from pydantic import BeforeValidator, Field

from kernel.exceptions import InvalidInput
from kernel.jsontypes import JSON

T = TypeVar("T")

# Deeper than any config or record needs, far below Python's recursion limit.
MAX_DEPTH = 64
# A config file or form is a few KB; this bounds what a parser will even look at.
MAX_CONFIG_BYTES = 1024 * 1024
# For integer fields of schemas (seeds, counts, bigint columns): a 64-bit integer. Free-form
# JSON (metadata, params) keeps any integer, as jsonb does; a float read back from jsonb
# may come back as a large integer (1e19 is stored as 10000000000000000000).
MAX_INT = 2**63 - 1


class InputRejected(InvalidInput, ValueError):
    """Input refused before anything was written; `field` names where (a dotted path,
    `line 3`, or `body`), `message` says why. An InvalidInput of the one error base (so
    every door answers it as a 422 naming the field), and a ValueError so that pydantic
    validators may raise it."""

    code = "input_rejected"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def text_check(value: str, *, field: str) -> str:
    """`value` unchanged, or InputRejected if Postgres could not store it."""
    if "\x00" in value:
        raise InputRejected(field, "text may not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputRejected(field, "text is not valid Unicode (lone surrogate)") from None
    return value


def number_check(value: T, *, field: str) -> T:
    if isinstance(value, float) and not math.isfinite(value):
        raise InputRejected(field, "numbers must be finite")
    return value


def tree_check(value: T, *, path: str = "", root: str = "body", max_depth: int = MAX_DEPTH) -> T:
    """`value` unchanged if it is a JSON tree Postgres can store as it is: text without NUL
    or lone surrogates, finite numbers, string keys, at most `max_depth` deep. Otherwise
    InputRejected naming the dotted path of the first bad value (`root` for the root)."""
    _tree_walk(value, path, 0, max_depth, root)
    return value


def _tree_walk(value: object, path: str, depth: int, max_depth: int, root: str) -> None:
    where = path or root
    if depth > max_depth:
        raise InputRejected(where, f"nested more than {max_depth} levels deep")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        text_check(value, field=where)
    elif isinstance(value, int | float):
        number_check(value, field=where)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InputRejected(where, f"keys must be text, got {type(k).__name__} {k!r}")
            text_check(k, field=where)
            _tree_walk(v, _join(path, k), depth + 1, max_depth, root)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _tree_walk(v, _join(path, i), depth + 1, max_depth, root)
    else:
        raise InputRejected(where, f"{type(value).__name__} is not a JSON value (text, number, true/false, null, list or mapping)")


# --- decoding and parsing ----------------------------------------------------------------

def utf8_decode(data: bytes, *, name: str = "input") -> str:
    """Strict UTF-8 (a BOM is dropped); InputRejected names the line and column of the
    first undecodable byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputRejected(
            f"line {line}",
            f"{name} is not UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); save it as UTF-8",
        ) from None
    return text.removeprefix("\ufeff")


def _reject_constant(name: str) -> NoReturn:
    raise InputRejected("", f"{name} is not a JSON number")


def json_parse(text: str | bytes, *, where: str = "body", max_depth: int = MAX_DEPTH) -> JSON:
    """JSON without NaN/Infinity, nested at most `max_depth`, holding only what Postgres
    can store (`tree_check`); InputRejected names the bad value's dotted path, or `where`
    for the document as a whole."""
    if isinstance(text, bytes):
        text = utf8_decode(text, name=where)
    try:
        data: JSON = json.loads(text, parse_constant=_reject_constant)
    except InputRejected as exc:
        raise InputRejected(where, exc.message) from None
    except RecursionError:
        raise InputRejected(where, f"nested more than {max_depth} levels deep") from None
    except json.JSONDecodeError as exc:
        raise InputRejected(where, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except ValueError as exc:  # integers past Python's digit limit
        raise InputRejected(where, f"not valid JSON ({exc})") from None
    return tree_check(data, root=where, max_depth=max_depth)


def _safe_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader that refuses aliases (their expansion is unbounded: a 1 KB file
        becomes 10^8 nodes) and bounds nesting (the composer recurses per level)."""

        _depth = 0

        def _where(self) -> str:
            """The line the next event starts on, as a refusal names it."""
            event: yaml.events.Event = self.peek_event()  # type: ignore[no-untyped-call]  # types-PyYAML leaves Parser.peek_event unannotated
            mark = event.start_mark
            return f"line {mark.line + 1}" if mark is not None else "the document"

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            if self.check_event(yaml.AliasEvent):
                raise InputRejected(self._where(), "YAML aliases (*name) are not accepted; write the value out")
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise InputRejected(self._where(), f"nested more than {MAX_DEPTH} levels deep")
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    # Dates stay text: a config or record holds JSON values, and `2024-01-01` is a string there.
    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


_LOADER: type | None = None


def yaml_parse(text: str, *, where: str = "config") -> JSON:
    """YAML parsed safely, aliases refused, depth bounded, and the result checked like JSON
    (`tree_check`); InputRejected names the line or the bad value's path."""
    global _LOADER
    import yaml

    if _LOADER is None:
        _LOADER = _safe_loader()
    if len(text) > MAX_CONFIG_BYTES:
        raise InputRejected(where, f"{len(text)} characters; at most {MAX_CONFIG_BYTES} are read")
    text_check(text, field=where)
    try:
        data: JSON = yaml.load(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"line {mark.line + 1}" if mark else where
        raise InputRejected(line, f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise InputRejected(where, f"not valid YAML: {exc}") from None
    except RecursionError:
        raise InputRejected(where, f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # integers past Python's digit limit
        if isinstance(exc, InputRejected):
            raise
        raise InputRejected(where, f"not valid YAML: {exc}") from None
    return tree_check(data, root=where)


def config_text_parse(data: bytes | str, *, filename: str) -> JSON:
    """A config file's bytes or text, size-bounded, strictly UTF-8, as JSON (`.json`) or
    YAML (anything else)."""
    size = len(data)
    if size > MAX_CONFIG_BYTES:
        raise InputRejected(filename, f"{size} bytes; a config file may have at most {MAX_CONFIG_BYTES}")
    text = utf8_decode(data, name=filename) if isinstance(data, bytes) else data
    if filename.endswith(".json"):
        return json_parse(text, where=filename)
    return yaml_parse(text, where=filename)


def jsonl_records(lines: Iterator[bytes]) -> Iterator[tuple[str, JSON]]:
    """(`line N`, record) for each non-blank line; InputRejected names the line and,
    within it, the field."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputRejected(where, f"not UTF-8 (byte 0x{line[exc.start]:02x} at column {exc.start + 1}); save the file as UTF-8") from None
        if lineno == 1:
            text = text.removeprefix("\ufeff")
        try:
            record = json_parse(text, where=where)
        except InputRejected as exc:
            field = where if exc.field == where else f"{where}: {exc.field}"
            raise InputRejected(field, exc.message) from None
        yield where, record


# --- typed fields ------------------------------------------------------------------------

def _no_bool(value: T) -> T:
    # pydantic's lax mode takes true/false for 1/0; a reward of `true` is a client's bug.
    if isinstance(value, bool):
        raise ValueError("expected a number, not true/false")  # noqa: TRY004 - pydantic reports ValueError, not TypeError, as a field error
    return value


# For schemas: numbers that refuse true/false, floats that refuse NaN and infinity, and
# 64-bit integers.
Number = Annotated[float, BeforeValidator(_no_bool), Field(allow_inf_nan=False)]
Integer = Annotated[int, BeforeValidator(_no_bool), Field(ge=-MAX_INT - 1, le=MAX_INT)]
