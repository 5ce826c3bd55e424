"""experience_write: idempotent, all-or-nothing."""

from __future__ import annotations

import math

import pytest

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.runs.models import Run
from kernel.exceptions import InvalidInput
from tests.factories import experience_row

pytestmark = pytest.mark.django_db


def test_it_writes_a_batch_and_reports_what_it_created(run: Run) -> None:
    rows = [experience_row(run, key=f"k{i}") for i in range(5)]
    result = experience_write(experiences=rows)
    assert result.created == 5 and result.duplicates == 0
    assert sorted(Experience.objects.filter(run=run).values_list("key", flat=True)) == [f"k{i}" for i in range(5)]


def test_writing_the_same_batch_twice_stores_it_once(run: Run) -> None:
    rows = [experience_row(run, key=f"k{i}") for i in range(5)]
    experience_write(experiences=rows)
    again = experience_write(experiences=rows)
    assert again.created == 0 and again.duplicates == 5
    assert Experience.objects.filter(run=run).count() == 5
    assert len(again.ids) == 5


def test_a_batch_overlapping_an_earlier_one_adds_only_the_new_rows(run: Run) -> None:
    experience_write(experiences=[experience_row(run, key="a"), experience_row(run, key="b")])
    result = experience_write(experiences=[experience_row(run, key="b"), experience_row(run, key="c")])
    assert (result.created, result.duplicates) == (1, 1)
    assert Experience.objects.filter(run=run).count() == 3


@pytest.mark.parametrize(
    ("bad", "field", "message"),
    [
        ({"logprobs": [-0.1, -0.2]}, "logprobs", "logprobs has 2 entries for 4 response tokens"),
        ({"action_mask": [1, 1, 1]}, "action_mask", "action_mask has 3 entries for 4 response tokens"),
        ({"action_mask": [1, 2, 1, 0]}, "action_mask", "1 (the model acted) or 0"),
        ({"reward": math.nan}, "reward", "reward must be a finite number"),
        ({"reward": math.inf}, "reward", "reward must be a finite number"),
        ({"logprobs": [-0.1, math.nan, -0.1, -0.1]}, "logprobs", "logprobs must be finite numbers"),
        ({"prompt_length": 99}, "prompt_length", "prompt_length 99 does not fit"),
        ({"token_ids": ["a", "b"]}, "token_ids", "token_ids must be a list of integers"),
        ({"reward_parts": {"acc": math.nan}}, "reward_parts", "reward_parts must map names to finite numbers"),
        ({"bogus": 1}, "bogus", "unknown field 'bogus'"),
        ({"status": "leased"}, "status", "cannot be written as leased"),
        ({"group_id": "g" * 101}, "group_id", "longer than 100 characters"),
        ({"finish_reason": "x" * 21}, "finish_reason", "at most 20 characters"),
    ],
)
def test_a_malformed_experience_is_refused_naming_the_field_and_nothing_is_written(
    run: Run, bad: dict, field: str, message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        experience_write(experiences=[experience_row(run, key="good-0"), experience_row(run, key="bad", **bad)])
    assert caught.value.field == field and message in caught.value.message
    assert Experience.objects.count() == 0


@pytest.mark.parametrize(
    ("bad", "field", "message"),
    [
        ({"run_id": 987654}, "2.run_id", "unknown run 987654"),
        ({"task_id": 987654}, "2.task_id", "unknown task 987654"),
        ({"parent_id": 987654}, "2.parent_id", "unknown parent experience 987654"),
        ({"key": "good-0"}, "2.key", "repeats row 0"),
    ],
)
def test_a_batch_that_does_not_fit_the_database_is_refused_naming_the_row(
    run: Run, bad: dict, field: str, message: str
) -> None:
    rows = [experience_row(run, key="good-0"), experience_row(run, key="good-1"), experience_row(run, **{"key": "bad", **bad})]
    with pytest.raises(InvalidInput) as caught:
        experience_write(experiences=rows)
    assert caught.value.field == field and message in caught.value.message
    assert Experience.objects.count() == 0


def test_only_drafts_are_written(run: Run) -> None:
    with pytest.raises(TypeError, match="ExperienceDraft"):
        experience_write(experiences=[dict(experience_row(run, key="a"))])  # type: ignore[list-item]
    assert Experience.objects.count() == 0


def test_the_ids_of_new_and_existing_experiences_come_back_in_order(run: Run) -> None:
    first = experience_write(experiences=[experience_row(run, key="b")])
    result = experience_write(experiences=[experience_row(run, key=k) for k in ("a", "b", "c")])
    stored = dict(Experience.objects.filter(run=run).values_list("key", "id"))
    assert result.ids == [stored["a"], stored["b"], stored["c"]] and result.ids[1] == first.ids[0]
    assert result.is_new == [True, False, True]


def test_the_same_key_in_two_runs_is_two_experiences(run: Run, owner) -> None:
    from tests.factories import make_run

    other = make_run(owner=owner, name="other")
    experience_write(experiences=[experience_row(run, key="k"), experience_row(other, key="k")])
    assert Experience.objects.filter(key="k").count() == 2


def test_an_empty_batch_writes_nothing() -> None:
    assert experience_write(experiences=[]).created == 0


def test_nul_characters_in_model_output_are_stored_as_replacement_characters(run: Run) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a\x00b"}]
    experience_write(experiences=[experience_row(run, key="nul", response_text="x\x00y", messages=messages)])
    stored = Experience.objects.get(key="nul")
    assert stored.response_text == "x\ufffdy"
    assert stored.messages is not None and stored.messages[1]["content"] == "a\ufffdb"
