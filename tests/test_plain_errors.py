"""pydantic's errors in plain words naming the field (kernel/plain_errors.py, issue 45 item 5),
one per error type a config can raise."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.plain_errors import errors_plain, field_label


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")
    learning_rate: float = Field(1e-5, gt=0, lt=1)
    total_steps: int = Field(1, ge=1, le=100)
    mode: Literal["sync", "async"] = "sync"
    name: str = Field("x", min_length=2, max_length=4)
    stop: list[str] = Field(default_factory=list, max_length=2)
    on: bool = False


class _Config(BaseModel):
    model: str
    block: _Block = Field(default_factory=_Block)


def _said(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        _Config.model_validate(data)
    return dict(errors_plain(caught.value))


@pytest.mark.parametrize(("block", "path", "message"), [
    ({"total_steps": 0}, "block.total_steps", "Total steps must be at least 1"),
    ({"total_steps": 101}, "block.total_steps", "Total steps must be at most 100"),
    ({"total_steps": "ten"}, "block.total_steps", "Total steps must be a whole number"),
    ({"total_steps": 1.5}, "block.total_steps", "Total steps must be a whole number"),
    ({"learning_rate": 0}, "block.learning_rate", "Learning rate must be more than 0"),
    ({"learning_rate": 1.0}, "block.learning_rate", "Learning rate must be less than 1"),
    ({"learning_rate": "fast"}, "block.learning_rate", "Learning rate must be a number"),
    ({"mode": "sideways"}, "block.mode", "Mode must be one of 'sync' or 'async'"),
    ({"name": "a"}, "block.name", "Name must be at least 2 characters long"),
    ({"name": "abcde"}, "block.name", "Name must be at most 4 characters long"),
    ({"stop": ["a", "b", "c"]}, "block.stop", "Stop may have at most 2 items"),
    ({"stop": "a"}, "block.stop", "Stop must be a list"),
    ({"on": "perhaps"}, "block.on", "On must be true or false"),
])
def test_each_error_type_reads_as_plain_words_naming_the_field(block: dict[str, object], path: str, message: str) -> None:
    assert _said({"model": "m", "block": block}) == {path: message}


def test_a_missing_field_is_required_and_a_block_must_be_a_mapping() -> None:
    assert _said({}) == {"model": "Model is required"}
    assert _said({"model": "m", "block": 3}) == {"block": "Block must be a mapping of keys to values"}


def test_a_label_is_the_last_name_in_the_path() -> None:
    assert field_label(("rewards", 0, "weight")) == "Weight"
    assert field_label(("sampling", "top_p")) == "Top p"
    assert field_label((0,)) == "Value"
