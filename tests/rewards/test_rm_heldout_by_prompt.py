"""The reward model's held-out pairs are split by prompt, never by attempt: a task explored
again is a new group with the same prompt, and a split by group would train on the prompt and
measure on it too ("prompts the reward model never saw" would not hold).

Personas: Olga owns the run; Anna compares the two answers of every attempt."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.reward_model.preferences import pair_is_heldout, prompt_is_heldout
from apps.feedback.kinds.pairwise import feedback_compare
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run
from workers.reward.trainer import reward_model_pairs
from apps.runs.ports import run_view_of

pytestmark = pytest.mark.django_db

PROMPTS = 40
ATTEMPTS = 3  # each prompt explored three times: three groups of the same prompt


def _attempts(run: Run) -> list[tuple[Experience, Experience]]:
    """Every prompt's attempts, each a group of two answers."""
    rows = []
    for p in range(PROMPTS):
        for a in range(ATTEMPTS):
            group = f"p{p}-attempt{a}"
            for i in range(2):
                rows.append(experience_row(run, key=f"{group}-{i}", group=group, status="pending", reward=None,
                                           auto_reward=0.0, prompt_text=f"What is {p} + 1?",
                                           response_text=f"<answer>{p + 1}</answer>" if i == 0 else f"{p + 1} {a}"))
    exps = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    return [(exps[i], exps[i + 1]) for i in range(0, len(exps), 2)]


@pytest.fixture
def olga_run(owner: User, annotator: User) -> Run:
    run = make_run(owner=owner, feedback={"mode": "blend"},
                   reward_model={"enabled": True, "heldout_share": 0.25, "retrain_every": 1})
    add_member(run, annotator)
    for tagged, bare in _attempts(run):
        feedback_compare(run=run, author=annotator, experience=bare, other=tagged, winner="b")
    return run


def test_the_held_out_split_never_shares_a_prompt_with_the_training_split(olga_run: Run) -> None:
    train, heldout = reward_model_pairs(run=run_view_of(olga_run))
    assert len(train) + len(heldout) == PROMPTS * ATTEMPTS
    assert heldout and train
    trained_prompts = {p.prompt for p in train}
    held_prompts = {p.prompt for p in heldout}
    assert not trained_prompts & held_prompts
    # Every attempt of a held-out prompt is held out: whole prompts, each with all its groups.
    assert all(sum(p.prompt == prompt for p in heldout) == ATTEMPTS for prompt in held_prompts)
    assert 4 <= len(held_prompts) <= 20  # about a quarter of the 40 prompts


def test_the_split_is_by_prompt_text_whatever_group_a_pair_came_from(olga_run: Run) -> None:
    train, heldout = reward_model_pairs(run=run_view_of(olga_run))
    for pair in train + heldout:
        assert pair_is_heldout(pair, share=0.25, seed=olga_run.cfg.seed) == \
            prompt_is_heldout(pair.prompt, share=0.25, seed=olga_run.cfg.seed)
    # Another seed draws another split, still by prompt.
    other = {p.prompt for p in train + heldout if prompt_is_heldout(p.prompt, share=0.25, seed=olga_run.cfg.seed + 1)}
    assert other != {p.prompt for p in heldout}
