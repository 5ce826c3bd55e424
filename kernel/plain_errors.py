"""pydantic's validation errors in plain words that name the field (issue 45 item 5).

pydantic says "Input should be greater than or equal to 1" and "Field required"; a person
filling in the run form reads "Total steps must be at least 1" and "Total steps is
required". Each error is translated by its type, with the field's label (its last name in
the path, underscores as spaces: `sampling.total_steps` → "Total steps", as the form labels
it). A type not listed keeps pydantic's wording after the label. Pure: the config kernel
and the pipeline registry use it, without Django.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails

_Ctx = Mapping[str, object]


def field_label(loc: Sequence[int | str]) -> str:
    """The label of the field at `loc`: its last name (not a list index), "Value" if none."""
    names = [str(part) for part in loc if isinstance(part, str)]
    if not names:
        return "Value"
    words = names[-1].replace("_", " ").strip()
    return words[:1].upper() + words[1:] if words else "Value"


def _number(value: object) -> str:
    # 0.0 reads "0", 1e-06 stays as it is.
    return f"{value:g}" if isinstance(value, float) else str(value)


def _items(n: object) -> str:
    return f"{n} item" if n == 1 else f"{n} items"


def _characters(n: object) -> str:
    return f"{n} character" if n == 1 else f"{n} characters"


# pydantic's error type → the message after the label, where the error's context changes nothing.
_FIXED: dict[str, str] = {
    "missing": "is required",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be text",
    "list_type": "must be a list",
    "dict_type": "must be a mapping of keys to values",
    "model_type": "must be a mapping of keys to values",
    "model_attributes_type": "must be a mapping of keys to values",
}

# pydantic's error type → the message after the label, given the error's context (a bound, a pattern).
_PLAIN: dict[str, Callable[[_Ctx], str]] = {
    "greater_than_equal": lambda c: f"must be at least {_number(c.get('ge'))}",
    "greater_than": lambda c: f"must be more than {_number(c.get('gt'))}",
    "less_than_equal": lambda c: f"must be at most {_number(c.get('le'))}",
    "less_than": lambda c: f"must be less than {_number(c.get('lt'))}",
    "multiple_of": lambda c: f"must be a multiple of {_number(c.get('multiple_of'))}",
    "string_too_short": lambda c: f"must be at least {_characters(c.get('min_length'))} long",
    "string_too_long": lambda c: f"must be at most {_characters(c.get('max_length'))} long",
    "string_pattern_mismatch": lambda c: f"must match the pattern {c.get('pattern')}",
    "literal_error": lambda c: f"must be one of {c.get('expected')}",
    "enum": lambda c: f"must be one of {c.get('expected')}",
    "too_short": lambda c: f"needs at least {_items(c.get('min_length'))}",
    "too_long": lambda c: f"may have at most {_items(c.get('max_length'))}",
}


def error_plain(err: ErrorDetails) -> str:
    """One pydantic error in plain words, naming its field by label. A validator's own
    message (a ValueError) stays as written; one that begins "must"/"needs" gets the label."""
    label = field_label(err["loc"])
    kind = err["type"]
    if kind == "value_error":
        message = err["msg"].removeprefix("Value error, ")
        return f"{label} {message}" if message.startswith(("must ", "needs ")) else message
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return f"{label} {fixed}"
    plain = _PLAIN.get(kind)
    if plain is not None:
        return f"{label} {plain(err.get('ctx') or {})}"
    msg = err["msg"]
    return f"{label}: {msg[:1].lower()}{msg[1:]}"


def errors_plain(exc: ValidationError) -> list[tuple[str, str]]:
    """Each error of `exc` as (its dotted path, its plain message), in pydantic's order."""
    return [(".".join(str(p) for p in err["loc"]), error_plain(err)) for err in exc.errors()]
