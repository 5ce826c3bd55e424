"""Round 49 renamed two plugin hooks (docs/concepts.md#names): a plugin written on an old name
is refused where it is declared, never silently ignored."""

from __future__ import annotations

import pytest

from apps.feedback.kinds import FeedbackKind


def test_a_feedback_kind_on_the_old_signals_name_is_refused() -> None:
    with pytest.raises(TypeError, match="signals is now votes"):
        type("OldKind", (FeedbackKind,), {"signals": lambda self, fb: []})


def test_an_objective_on_the_old_no_signal_name_is_refused() -> None:
    from workers.algorithms.objectives import Objective  # torch: only this test pays for it

    with pytest.raises(TypeError, match="no_signal is now no_gradient"):
        type("OldObjective", (Objective,), {"no_signal": lambda self, batch: None})
    assert type("NewObjective", (Objective,), {"no_gradient": lambda self, batch: None})
