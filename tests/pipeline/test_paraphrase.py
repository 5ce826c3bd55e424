"""Paraphrase synthesis through a rollout engine, on a worker (tiny local model, CPU)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from apps.buffer.importers import taskset_create
from apps.buffer.models import Task
from apps.buffer.pipeline.synthesize import paraphrase_accept
from tests.servers import celery_worker

ROOT = Path(__file__).resolve().parents[2]
RECORDS = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b), "domain": "math"} for a, b in ((3, 4), (10, 7))]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("para-model"), hidden_size=32, layers=1, heads=2)


@pytest.mark.parametrize(
    ("candidate", "why"),
    [
        ("Add 3 and 4: what do you get?", None),
        ("Add three and four.", "lost_numbers"),
        ("  what is 3 + 4?  ", "unchanged"),
        ("   ", "empty"),
    ],
)
def test_a_paraphrase_must_keep_the_numbers_and_change_the_words(candidate: str, why: str | None) -> None:
    assert paraphrase_accept("What is 3 + 4?", candidate, require_numbers=True) == why


def test_the_workers_params_type_names_every_field_the_pipeline_sends() -> None:
    """The pipeline sends ParaphraseParams dumped, with the model filled in; the worker reads
    them through its TypedDict, which names each of those fields."""
    from apps.buffer.pipeline.synthesize import ParaphraseParams
    from workers.explore.synthesize import ParaphraseParams as WorkerParams

    sent = set(ParaphraseParams().model_dump()) | {"model"}
    assert sent <= set(WorkerParams.__annotations__)


@pytest.mark.django_db
@pytest.mark.slow
def test_paraphrases_from_the_engine_become_synthetic_tasks_keeping_the_reference(owner, tiny_model: Path) -> None:
    from workers.engines import engine_create
    from workers.explore.synthesize import Sampling, tasks_paraphrase

    taskset = taskset_create(name="t", records=RECORDS, owner=owner)
    engine = engine_create(backend="transformers", path=str(tiny_model))
    counts = tasks_paraphrase(taskset_id=taskset.pk, engine=engine, tokenizer=engine.tokenizer, n=2,
                              sampling=Sampling(max_tokens=8, seed=0), require_numbers=False)
    made = list(Task.objects.filter(taskset=taskset, is_synthetic=True).order_by("index"))
    assert counts["asked"] == 4 and counts["accepted"] == len(made) >= 1
    assert sum(v for k, v in counts.items() if k.startswith("rejected_")) == 4 - len(made)
    by_index = {t.index: t for t in Task.objects.filter(taskset=taskset, is_synthetic=False)}
    for task in made:
        source = by_index[task.metadata["synthetic_from"]]
        assert task.reference == source.reference and task.domain == "math" and task.prompt != source.prompt
    assert [t.index for t in made] == list(range(2, 2 + len(made)))
    # Idempotent: tasks already paraphrased are not asked again.
    again = tasks_paraphrase(taskset_id=taskset.pk, engine=engine, tokenizer=engine.tokenizer, n=2,
                             sampling=Sampling(max_tokens=8, seed=0), require_numbers=False)
    paraphrased = {t.metadata["synthetic_from"] for t in made}
    assert again["asked"] == 2 * (len(RECORDS) - len(paraphrased))


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_an_import_step_has_a_celery_worker_paraphrase_the_taskset(owner, tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    with celery_worker("rollout", name="paraphrase", log=log, includes=("workers.explore.synthesize",)) as worker:
        taskset = taskset_create(name="t", records=RECORDS, owner=owner, pipeline=[{
            "name": "synth_paraphrase",
            "params": {"model": str(tiny_model), "n": 2, "max_tokens": 8, "require_numbers": False},
        }])
        assert taskset.pipeline_counts == {"synth_paraphrase/enqueued": 1}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not Task.objects.filter(taskset=taskset, is_synthetic=True).exists():
            assert worker.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        made = Task.objects.filter(taskset=taskset, is_synthetic=True)
        assert made.exists(), log.read_text()[-3000:]
        assert {t.metadata["synthetic"] for t in made} == {"paraphrase"}
