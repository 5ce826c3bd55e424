"""The crawl's form filling (tests/crawler.py, issue 62.7): a valid value for each kind of
field within its constraints, the person's own value where only they know one, none where
nothing fits (the crawl then fails on the form), and an invalid value the server must refuse."""

from __future__ import annotations

from typing import Any

from tests.crawler import field_spoiled, field_value


def _field(kind: str, name: str = "f", **extra: Any) -> dict[str, Any]:
    return {"k": 0, "name": name, "type": kind, "value": "", "required": True, "valid": False, "min": "", "max": "",
            "step": "", "minlength": 0, "maxlength": 0, "pattern": "", "options": [], **extra}


def test_each_kind_of_field_gets_a_value_it_accepts() -> None:
    assert field_value(_field("email"), {}) == ("crawler@example.com", "value")
    assert field_value(_field("number", min="3", max="9"), {}) == ("3", "value")
    assert field_value(_field("number", max="0.5"), {}) == ("0.5", "value")
    assert field_value(_field("select", options=["", "a", "b"]), {}) == ("a", "value")
    assert field_value(_field("checkbox", value="on"), {}) == ("on", "check")
    text = field_value(_field("text", minlength=12, maxlength=14), {})
    assert text is not None and 12 <= len(text[0]) <= 14
    assert field_value(_field("textarea"), {}) == ("A crawl's text.", "value")


def test_a_persons_own_value_comes_first_and_a_field_only_they_could_fill_is_not_guessed() -> None:
    assert field_value(_field("password", "old_password"), {"old_password": "pw-1234567"}) == ("pw-1234567", "value")
    assert field_value(_field("password", "old_password"), {}) is None
    assert field_value(_field("text", pattern="[0-9]{6}"), {}) is None
    assert field_value(_field("file", "taskset"), {}) is None
    assert field_value(_field("select", options=[""]), {}) is None


def _how(field: dict[str, Any]) -> str:
    spoiled = field_spoiled(field)
    assert spoiled is not None
    return spoiled[1]


def test_the_invalid_value_is_an_emptied_required_field_else_a_wrong_type_or_choice() -> None:
    assert field_spoiled(_field("text", "name")) == ("", "value", "name left empty")
    assert _how(_field("select", "role", options=["a"])) == "choice"
    assert _how(_field("number", "n", required=False)) == "mistype"
    assert _how(_field("email", "e", required=False)) == "mistype"
    assert field_spoiled(_field("text", required=False)) is None
