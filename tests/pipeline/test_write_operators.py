"""Operators applied when experiences are written: each on crafted rows."""

from __future__ import annotations

import math
from typing import Any

import pytest

from apps.buffer.drafts import ExperienceDraft
from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from kernel.exceptions import InvalidInput
from tests.factories import experience_row
from tests.pipeline.conftest import metrics, reasons

pytestmark = pytest.mark.django_db


def _group(run: Any, group: str, rewards: list[float | None], **fields: Any) -> list[ExperienceDraft]:
    return [experience_row(run, key=f"{group}-{i}", group=group, reward=r, **fields) for i, r in enumerate(rewards)]


def test_clean_normalises_whitespace_and_drops_control_characters(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "clean"}])
    experience_write(experiences=[
        experience_row(run, key="messy", prompt_text="  What is\u00a01 + 1?\r\n", response_text="The\x00 answer\x07 is   \n\n\n\n<answer>2</answer>\t "),
        experience_row(run, key="code", response_text="def f():\n    return 2\n"),
    ])
    messy = Experience.objects.get(run=run, key="messy")
    assert messy.prompt_text == "What is 1 + 1?"
    assert messy.response_text == "The answer is\n\n<answer>2</answer>"
    assert messy.status == "ready"
    # Indentation is meaning in code: only the trailing newline goes.
    assert Experience.objects.get(run=run, key="code").response_text == "def f():\n    return 2"
    assert metrics(run) == {"pipeline/write/clean/control_chars": 1.0, "pipeline/write/clean/whitespace": 2.0}


def test_clean_masks_truncated_and_over_long_responses_from_the_loss(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "clean", "params": {"max_response_tokens": 5}}])
    experience_write(experiences=[
        experience_row(run, key="cut", finish_reason="length", response_len=4),
        experience_row(run, key="long", response_len=6, finish_reason="stop"),
        experience_row(run, key="fine", response_len=4, finish_reason="stop"),
    ])
    rows = {e.key: e for e in Experience.objects.filter(run=run)}
    assert rows["cut"].action_mask == [0, 0, 0, 0] and rows["cut"].metadata["loss_masked"] == "truncated"
    assert rows["long"].action_mask == [0] * 6 and rows["long"].metadata["loss_masked"] == "over_long"
    assert rows["fine"].action_mask is None and "loss_masked" not in rows["fine"].metadata
    # Masked, not filtered: they still count in their groups' reward statistics.
    assert {e.status for e in rows.values()} == {"ready"}


def test_clean_can_filter_truncated_responses_instead(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "clean", "params": {"truncated": "filter"}}])
    experience_write(experiences=[experience_row(run, key="cut", finish_reason="length"), experience_row(run, key="ok")])
    assert reasons(run) == {"cut": "truncated"}


def test_exact_dedup_drops_repeats_across_groups_and_batches_but_not_within_a_group(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "dedup_exact"}])
    same: dict[str, Any] = {"response_text": "<answer>4</answer>"}
    experience_write(experiences=[
        experience_row(run, key="a0", group="a", **same),
        experience_row(run, key="a1", group="a", **same),  # a second sample of one prompt
        experience_row(run, key="b0", group="b", response_text="  <ANSWER>4</answer> "),  # normalised equal
        experience_row(run, key="b1", group="b", response_text="<answer>5</answer>"),
    ])
    experience_write(experiences=[experience_row(run, key="c0", group="c", **same)])
    found = reasons(run)
    assert set(found) == {"b0", "c0"}
    assert all(r.startswith("duplicate") for r in found.values())
    assert metrics(run)["pipeline/write/dedup_exact/duplicate"] == 2.0


def test_a_retried_write_is_not_its_own_duplicate(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "dedup_exact"}])
    rows = [experience_row(run, key="k", group="g")]
    experience_write(experiences=rows)
    again = experience_write(experiences=rows)
    assert again.duplicates == 1
    assert Experience.objects.get(run=run, key="k").status == "ready"


def test_near_dedup_drops_near_copies_with_minhash(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "dedup_near", "params": {"threshold": 0.7, "fields": "response"}}])
    base = "First add the tens, then the ones, and the sum of twelve and thirty is forty-two. <answer>42</answer>"
    experience_write(experiences=[
        experience_row(run, key="orig", group="a", response_text=base),
        experience_row(run, key="near", group="b", response_text=base.replace("First", "So first")),
        experience_row(run, key="other", group="c", response_text="Multiply seven by six to get 42. <answer>42</answer>"),
    ])
    assert reasons(run) == {"near": "near_duplicate"}


def test_length_bounds_drop_too_short_and_too_long_responses(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "length_bounds", "params": {"min_tokens": 2, "max_tokens": 6, "max_chars": 30}}])
    experience_write(experiences=[
        experience_row(run, key="short", response_len=1),
        experience_row(run, key="long", response_len=7),
        experience_row(run, key="wordy", response_len=4, response_text="x" * 31),
        experience_row(run, key="fine", response_len=4),
    ])
    assert reasons(run) == {"short": "too_short: 1 tokens", "long": "too_long: 7 tokens", "wordy": "too_long: 31 characters"}


def test_a_nan_reward_is_stored_filtered_with_its_reason_instead_of_failing_the_batch(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "reward_invalid", "params": {"max_reward": 1.0, "require_reward": True}}])
    result = experience_write(experiences=[
        experience_row(run, key="huge", reward=7.0),
        experience_row(run, key="none", reward=None),
        experience_row(run, key="waiting", reward=None, status="pending"),
        experience_row(run, key="ok", reward=0.5),
    ])
    assert result.created == 4
    assert reasons(run) == {"huge": "reward_out_of_range: 7", "none": "missing_reward"}
    # NaN never reaches the pipeline: the experience's own type refuses it, naming the field.
    with pytest.raises(InvalidInput, match="reward: reward must be a finite number"):
        experience_row(run, key="nan", reward=math.nan)


def test_without_the_filter_a_nan_reward_still_rejects_the_batch(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "clean"}])
    with pytest.raises(InvalidInput, match="reward must be a finite number"):
        experience_write(experiences=[experience_row(run, key="a"), experience_row(run, key="b", reward=math.nan)])
    assert not Experience.objects.filter(run=run).exists()


def test_a_malformed_row_still_rejects_the_whole_batch_naming_the_callers_row(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "clean"}, {"name": "dedup_exact"}, {"name": "reward_variance"}])
    with pytest.raises(InvalidInput) as caught:
        experience_write(experiences=[experience_row(run, key="a"), experience_row(run, key="b", token_ids="nope")])
    assert caught.value.field == "token_ids"
    assert not Experience.objects.filter(run=run).exists()


def test_reward_variance_drops_groups_whose_rewards_are_all_equal(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "reward_variance"}], repeat_times=4)
    experience_write(experiences=[
        *_group(run, "flat", [1.0, 1.0, 1.0, 1.0]),
        *_group(run, "mixed", [1.0, 0.0, 1.0, 1.0]),
        *_group(run, "partial", [0.0, 0.0]),  # only half of a group: cannot judge yet
        *_group(run, "waiting", [None] * 4, status="pending"),
    ])
    found = reasons(run)
    assert set(found) == {f"flat-{i}" for i in range(4)}
    assert found["flat-0"] == "zero_variance: all 4 rewards = 1"
    assert metrics(run) == {"pipeline/write/reward_variance/zero_variance": 4.0}


def test_blocklist_drops_matching_responses(make_pipeline_run) -> None:
    run = make_pipeline_run(on_write=[{"name": "blocklist", "params": {"patterns": [r"as an ai", r"rm -rf"]}}])
    experience_write(experiences=[
        experience_row(run, key="bad", response_text="As an AI I cannot add."),
        experience_row(run, key="ok", response_text="<answer>2</answer>"),
    ])
    assert reasons(run) == {"bad": "blocklist: as an ai"}


def test_reward_variance_priority_puts_informative_groups_first(make_pipeline_run) -> None:
    from apps.buffer.services import batch_claim

    run = make_pipeline_run(on_write=[{"name": "priority_reward_variance"}], repeat_times=2)
    experience_write(experiences=[*_group(run, "low", [0.4, 0.6]), *_group(run, "high", [0.0, 1.0])])
    claimed = batch_claim(run=run, worker="w", size=2)
    assert {e.group_id for e in claimed} == {"high"}
    assert claimed[0].priority == pytest.approx(0.5)


def test_an_unconfigured_run_writes_exactly_as_before(run) -> None:
    row = experience_row(run, key="k", response_text="  spaced  ", reward=1.0)
    experience_write(experiences=[row])
    stored = Experience.objects.get(run=run, key="k")
    assert stored.response_text == "  spaced  " and stored.metadata == {} and stored.status == "ready"
