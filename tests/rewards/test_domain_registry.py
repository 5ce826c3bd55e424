"""A reward domain is registered once, beside the reward that scores it: a team adding
`units` tasks (answers that must carry their unit) writes one module — the reward function
and its route — and the config, the default routing, the misspelling check at import and the
run page's rewards table all know it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apps.buffer.importers import ImportFailed, taskset_create
from kernel import rewards as registry
from kernel.rewards import RewardResult, domain_register, register
from apps.rewards.scoring import rewards_inline
from kernel.config import config_validate
from kernel.plugin_names import domain_misspelt, domains


def _has_unit(completion: str, task: object, **_: object) -> RewardResult:
    """1 when the answer ends with the reference's unit."""
    unit = registry.reference_text(task).split()[-1]
    return RewardResult(score=1.0 if completion.strip().endswith(unit) else 0.0)


@pytest.fixture
def units_domain() -> Iterator[None]:
    register("has_unit")(_has_unit)
    domain_register("units", terms={"has_unit": 1.0})
    yield
    registry.REWARDS.remove("has_unit")
    registry.DOMAINS.remove("units")


TASK = {"domain": "units", "prompt": "How far is 3 km in metres?", "reference": "3000 m"}


def test_an_unregistered_domain_is_refused_in_a_term_and_scored_by_the_fallback() -> None:
    assert "units" not in domains()
    with pytest.raises(Exception, match="unknown domain 'units'"):
        config_validate(data={"model": "m", "rewards": [{"name": "exact_match", "domains": ["units"]}]})
    assert rewards_inline(terms=[], completion="3000 m", task=TASK).parts == {"exact_match": 1.0}


def test_a_registered_domain_routes_its_tasks_and_names_itself_everywhere(units_domain: None) -> None:
    assert "units" in domains()
    # Its tasks are scored by its own terms when the run names none.
    assert rewards_inline(terms=[], completion="3000 m", task=TASK).parts == {"has_unit": 1.0}
    assert rewards_inline(terms=[], completion="3000", task=TASK).parts == {"has_unit": 0.0}
    # A term may name it.
    cfg = config_validate(data={"model": "m", "rewards": [{"name": "has_unit", "domains": ["units"]}]})
    assert cfg.rewards[0].domains == ["units"]
    # A task that misspells it is caught, as for the built-in domains.
    assert domain_misspelt("Units") == "units"


@pytest.mark.django_db
def test_a_task_misspelling_a_registered_domain_is_refused_at_import(units_domain: None) -> None:
    with pytest.raises(ImportFailed, match="did you mean 'units'"):
        taskset_create(name="u", records=[{**TASK, "domain": "UNITS"}])
