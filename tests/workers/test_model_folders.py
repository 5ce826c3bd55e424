"""A model folder that lacks a part fails saying which (issue 32): a folder whose tokenizer is
gone (copied without it, or deleted after the run was created and started, when the form's
check passed) fails the run with "has no tokenizer (tokenizer.json, …)" rather than the
library's "install sentencepiece or tiktoken"."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User

from apps.runs.failures import task_failure_record
from apps.runs.models import Run
from kernel.exceptions import InvalidInput
from tests.factories import make_run, make_taskset
from workers.models.tiny import tiny_model_save

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "chat_template.jinja")


def without_tokenizer(folder: Path) -> Path:
    for name in TOKENIZER_FILES:
        (folder / name).unlink(missing_ok=True)
    return folder


@pytest.fixture(scope="module")
def half_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return without_tokenizer(tiny_model_save(tmp_path_factory.mktemp("half") / "model", hidden_size=16, layers=1,
                                             heads=2))


def test_loading_a_tokenizer_from_a_folder_without_one_names_what_is_missing(half_model: Path) -> None:
    from workers.engines.base import tokenizer_from_pretrained, tokenizer_load

    for load in (tokenizer_from_pretrained, tokenizer_load):
        with pytest.raises(InvalidInput) as caught:
            load(str(half_model))
        said = str(caught.value)
        assert f"{half_model} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)" in said
        assert "sentencepiece" not in said and "tiktoken" not in said


def test_the_transformers_engine_on_such_a_folder_fails_the_same_way(half_model: Path) -> None:
    from workers.engines.hf_engine import HFEngine

    with pytest.raises(InvalidInput, match="has no tokenizer"):
        HFEngine(path=str(half_model))


def test_a_folder_with_its_tokenizer_still_loads(tmp_path: Path) -> None:
    from workers.engines.base import tokenizer_load

    whole = tiny_model_save(tmp_path / "whole", hidden_size=16, layers=1, heads=2)
    assert tokenizer_load(str(whole)).encode("What is 1 + 1?")


@pytest.mark.django_db
def test_a_run_whose_tokenizer_went_missing_after_it_started_fails_saying_so(owner: User, tmp_path: Path) -> None:
    from workers.engines.hf_engine import HFEngine

    folder = tiny_model_save(tmp_path / "model", hidden_size=16, layers=1, heads=2)
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), model=str(folder))
    from apps.runs.services import run_transition

    run_transition(run=run, action="start", actor=owner)  # the check before the start passes
    without_tokenizer(folder)
    with pytest.raises(InvalidInput) as caught:
        HFEngine(path=run.cfg.model)  # what the explorer's first step does
    task_failure_record(run_id=run.pk, task="explore", step=1, worker="w1", exception=caught.value, fail_now=True)
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)" in run.error
    assert "sentencepiece" not in run.error
