"""experience_write: idempotent, all-or-nothing. Portable: also runs on the embedded SQLite."""

from __future__ import annotations

import math

import pytest

from apps.buffer.models import Experience
from apps.buffer.services import BatchRejected, experience_write
from apps.runs.models import Run
from tests.factories import experience_row

pytestmark = [pytest.mark.django_db, pytest.mark.portable]


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
    ("bad", "message"),
    [
        ({"logprobs": [-0.1, -0.2]}, "logprobs has 2 entries for 4 response tokens"),
        ({"action_mask": [1, 1, 1]}, "action_mask has 3 entries for 4 response tokens"),
        ({"reward": math.nan}, "reward must be a finite number"),
        ({"reward": math.inf}, "reward must be a finite number"),
        ({"run_id": 987654}, "unknown run 987654"),
        ({"task_id": 987654}, "unknown task 987654"),
        ({"prompt_length": 99}, "prompt_length 99 does not fit"),
        ({"token_ids": ["a", "b"]}, "token_ids must be a list of integers"),
        ({"reward_parts": {"acc": math.nan}}, "reward_parts must map names to finite numbers"),
        ({"bogus": 1}, "unknown field 'bogus'"),
        ({"status": "leased"}, "cannot be written as leased"),
    ],
)
def test_a_malformed_row_rejects_the_whole_batch_naming_the_row(run: Run, bad: dict, message: str) -> None:
    rows = [experience_row(run, key="good-0"), experience_row(run, key="good-1"), experience_row(run, key="bad", **bad)]
    with pytest.raises(BatchRejected) as caught:
        experience_write(experiences=rows)
    assert caught.value.row == 2
    assert message in str(caught.value)
    assert str(caught.value).startswith("row 2:")
    assert Experience.objects.count() == 0


def test_a_key_repeated_inside_one_batch_is_rejected(run: Run) -> None:
    with pytest.raises(BatchRejected, match="repeats row 0"):
        experience_write(experiences=[experience_row(run, key="same"), experience_row(run, key="same")])
    assert Experience.objects.count() == 0


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
    assert stored.messages[1]["content"] == "a\ufffdb"
