"""Feedback stored in the old shapes comes out of migration 0003 in the one shape per kind,
meaning the same: the trainer and the DPO export read the same choices, the fold the
same ratings, and nothing is lost."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.contrib.auth.models import User
from django.db import connection

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.feedback.selectors import dpo_pairs
from apps.feedback.kinds.fold import group_fold
from apps.feedback.selectors import preferences_among
from tests.envapi.conftest import make_key
from tests.factories import make_experiences, make_run

pytestmark = pytest.mark.django_db
migration = importlib.import_module("apps.feedback.migrations.0003_one_value_shape")


def _old(run: Any, kind: str, value: Any, a: Experience, b: Experience | None = None, **fields: Any) -> Feedback:
    # Written the way the old code wrote them, straight into the table: no service builds
    # these shapes any more.
    return Feedback.objects.create(run=run, kind=kind, experience=a, other=b, group_id=a.group_id, value=value,
                                   **fields)


def _migrate() -> None:
    with connection.schema_editor() as editor:
        migration.forwards(django_apps, editor)


def test_old_api_choices_are_read_as_the_same_preferences(owner: User) -> None:
    run = make_run(owner=owner)
    a, b = make_experiences(run, groups=1, group_size=2)
    rows = [_old(run, "pairwise", value, a, b) for value in (
        {"preferred": "a"}, {"preferred": "b"}, {"preferred": "tie"}, "B", "left", {"winner": b.pk},
        {"winner": "a"}, {"something": 1},
    )]
    _migrate()
    values = [Feedback.objects.get(pk=fb.pk).value for fb in rows]
    assert values == [{"winner": "a"}, {"winner": "b"}, {"winner": "tie"}, {"winner": "b"}, {"winner": "a"},
                      {"winner": "b"}, {"winner": "a"}, {"winner": "tie", "legacy": {"something": 1}}]
    a_wins, b_wins = (a.pk, b.pk), (b.pk, a.pk)
    assert preferences_among(run=run, ids=[a.pk, b.pk]) == [a_wins, b_wins, b_wins, a_wins, b_wins, a_wins]
    assert [(p.chosen_id, p.rejected_id) for p in dpo_pairs(run=run)] == [a_wins, b_wins, b_wins, a_wins, b_wins,
                                                                          a_wins]


def test_old_api_numbers_become_ratings_rewards_and_flags(owner: User) -> None:
    run = make_run(owner=owner, feedback={"mode": "human", "overlap": 1})
    key, _ = make_key(run)
    m = make_experiences(run, groups=1, group_size=3, status="pending")
    scored = _old(run, "rating", 5.0, m[0], api_key=key)
    unreadable = _old(run, "rating", -1.0, m[1], api_key=key)
    reward = _old(run, "env_reward", 0.75, m[2], api_key=key)
    flagged = _old(run, "flag", 1.0, m[2], api_key=key, comment="loops forever")
    reasoned = _old(run, "flag", {"reason": "wrong maths"}, m[1])
    browser = _old(run, "rating", {"score": 2, "thumb": None, "normalised": 0.25}, m[1])

    _migrate()
    _migrate()  # twice: a row already in the one shape is left alone

    stored = {fb.pk: fb.value for fb in Feedback.objects.all()}
    assert stored[scored.pk] == {"score": 5, "thumb": None, "normalised": 1.0}
    assert stored[unreadable.pk] == {"score": None, "thumb": None, "normalised": None, "legacy": -1.0}
    assert stored[reward.pk] == {"reward": 0.75, "reward_parts": {}}
    assert stored[flagged.pk] == {"flags": [], "reason": "loops forever"}
    assert stored[reasoned.pk] == {"flags": [], "reason": "wrong maths"}
    assert stored[browser.pk] == {"score": 2, "thumb": None, "normalised": 0.25}
    # The fold reads them now (it raised TypeError on the bare numbers before): the 5 is
    # the top of the scale; the unreadable number is kept but carries no signal.
    group_fold(run=run, group_id=m[0].group_id)
    first, second, _ = Experience.objects.filter(pk__in=[e.pk for e in m]).order_by("id")
    assert (first.human_reward, second.human_reward) == (1.0, 0.25)
