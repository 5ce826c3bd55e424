"""The configured order holds; config errors name the operator or the param."""

from __future__ import annotations

import pytest

from apps.buffer.services import experience_write
from kernel.config import ConfigInvalid, config_validate
from tests.factories import experience_row
from tests.pipeline.conftest import reasons


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("order", "expected"),
    [
        (["blocklist", "dedup_exact"], {"a0": "blocklist", "b0": "blocklist"}),
        (["dedup_exact", "blocklist"], {"a0": "blocklist", "b0": "duplicate"}),
    ],
)
def test_operators_run_in_the_configured_order(make_pipeline_run, order: list[str], expected: dict[str, str]) -> None:
    params = {"blocklist": {"patterns": ["bad"]}, "dedup_exact": {}}
    run = make_pipeline_run(on_write=[{"name": n, "params": params[n]} for n in order])
    experience_write(experiences=[
        experience_row(run, key="a0", group="a", response_text="bad answer"),
        experience_row(run, key="b0", group="b", response_text="bad answer"),
    ])
    assert {k: v.split(":")[0] for k, v in reasons(run).items()} == expected


@pytest.mark.django_db
def test_a_later_operator_does_not_see_rows_an_earlier_one_removed(make_pipeline_run) -> None:
    # The blocklist removes the group's only 0.0; judged on its live members, the group
    # is then all 1.0 and carries no advantage.
    run = make_pipeline_run(
        on_write=[{"name": "blocklist", "params": {"patterns": ["junk"]}}, {"name": "reward_variance", "params": {"group_size": 2}}]
    )
    experience_write(experiences=[
        experience_row(run, key="g-0", group="g", reward=0.0, response_text="junk"),
        experience_row(run, key="g-1", group="g", reward=1.0),
        experience_row(run, key="g-2", group="g", reward=1.0),
    ])
    assert {k: v.split(":")[0] for k, v in reasons(run).items()} == {"g-0": "blocklist", "g-1": "zero_variance", "g-2": "zero_variance"}


@pytest.mark.parametrize(
    ("pipeline", "field", "message"),
    [
        ({"on_write": [{"name": "dedupe"}]}, "pipeline.on_write.0.name", "unknown pipeline operator 'dedupe'; known: "),
        ({"on_claim": [{"name": "clean"}, {"name": "nope"}]}, "pipeline.on_claim.1.name", "unknown pipeline operator 'nope'"),
        ({"on_write": [{"name": "dedup_near", "params": {"threshold": 2}}]}, "pipeline.on_write.0.params",
         "dedup_near params: Threshold must be less than 1"),
        ({"on_write": [{"name": "clean", "params": {"trunc": "mask"}}]}, "pipeline.on_write.0.params",
         "clean params: trunc: unknown parameter"),
        ({"on_write": [{"name": "blocklist", "params": {"patterns": ["(unclosed"]}}]}, "pipeline.on_write.0.params",
         "pattern 0 '(unclosed' is not a valid regular expression"),
        ({"on_write": [{"name": "blocklist"}]}, "pipeline.on_write.0.params", "blocklist params: Patterns is required"),
        ({"on_write": [{"name": "curriculum", "params": {"band_low": 0.9, "band_high": 0.1}}]}, "pipeline.on_write.0.params",
         "band_low (0.9) is above band_high (0.1)"),
        ({"on_claim": [{"name": "synth_arithmetic"}]}, "pipeline.on_claim",
         "step 0: operator 'synth_arithmetic' cannot run on_claim; it runs on_import"),
        ({"on_import": [{"name": "human_flagged"}]}, "pipeline.on_import", "cannot run on_import; it runs on_claim"),
    ],
)
def test_a_bad_pipeline_config_names_the_step_and_the_problem(pipeline: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config_validate(data={"model": "m", "pipeline": pipeline})
    assert field in caught.value.errors, caught.value.errors
    assert message in caught.value.errors[field]


def test_every_operator_has_a_valid_default_or_says_what_it_needs() -> None:
    from apps.buffer.pipeline import DEFAULT_ON_WRITE, operator_names

    assert len(operator_names()) >= 13
    cfg = config_validate(data={"model": "m", "pipeline": {"on_write": DEFAULT_ON_WRITE}})
    assert [s.name for s in cfg.pipeline.on_write] == [s["name"] for s in DEFAULT_ON_WRITE]
