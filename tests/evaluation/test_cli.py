"""`rft evaluation create|figures|export|close` and `rft figures`'s blind-evaluation lines."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.evaluation.models import Evaluation, Vote
from apps.evaluation.selectors import evaluation_figures
from apps.runs.models import Run
from tests.evaluation.conftest import answer_all, publish

pytestmark = pytest.mark.django_db


def rft(*args: str) -> str:
    out = io.StringIO()
    call_command("rft", *args, stdout=out)
    return out.getvalue()


def test_create_figures_export_and_close_from_the_command_line(run: Run, owner: User, annotator: User,
                                                              tmp_path: Path) -> None:
    publish(run, 1, 2)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\n\nsecond prompt\n")
    said = rft("evaluation", "create", str(run.pk), "--as", "owner", "--versions", "0,1,2", "--prompts-file",
               str(prompts), "--seed", "3", "--votes-per-pair", "2")
    evaluation = Evaluation.objects.get()
    assert f"evaluation {evaluation.pk} (generating): v0 vs v1 vs v2, 2 prompts, seed 3" in said
    answer_all(evaluation)
    for item in evaluation.items.select_related("left", "right"):
        newer = "left" if item.left.number >= item.right.number else "right"
        Vote.objects.create(item=item, voter=annotator, choice="tie" if item.is_check else newer)
    fig = evaluation_figures(evaluation)
    text = rft("evaluation", "figures", str(evaluation.pk))
    for w in fig.win_rates:
        assert (f"{w.version} vs v0: win rate {w.rate:.3f} [{w.interval.low:.3f}, {w.interval.high:.3f}] "
                f"over {w.votes} votes") in text
    assert "Bradley–Terry v2" in text and "FLAGGED" not in text
    assert f"evaluation {evaluation.pk}" in rft("figures", str(run.pk))

    out = tmp_path / "votes.jsonl"
    rft("evaluation", "export", str(evaluation.pk), "--out", str(out))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == Vote.objects.count() == evaluation.items.count()
    assert [json.loads(line) for line in rft("evaluation", "export", str(evaluation.pk), "--out", "-").splitlines()] == records
    assert "is closed" in rft("evaluation", "close", str(evaluation.pk), "--as", "owner")
    assert evaluation.placement == "page"
    said = rft("evaluation", "create", str(run.pk), "--as", "owner", "--prompts-file", str(prompts), "--placement",
               "between")
    assert "also between annotation items" in said and Evaluation.objects.latest("pk").placement == "between"


def test_bad_arguments_are_messages(run: Run, owner: User) -> None:
    with pytest.raises(CommandError, match="published no version"):
        rft("evaluation", "create", str(run.pk), "--as", "owner", "--prompts-file", __file__)
    with pytest.raises(CommandError, match="is not N or RUN:N"):
        rft("evaluation", "create", str(run.pk), "--as", "owner", "--versions", "0,x")
    with pytest.raises(CommandError, match="placement must be one of page, between"):
        rft("evaluation", "create", str(run.pk), "--as", "owner", "--placement", "aside")
    with pytest.raises(CommandError, match="no evaluation 99"):
        rft("evaluation", "figures", "99")
