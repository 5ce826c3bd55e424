"""Taskset import from JSONL, Parquet or a local Hugging Face `datasets` directory.

Each record needs a prompt: `prompt` (text or chat messages) or `messages`, or `question`.
The reference answer comes from `answer`, `reference`, `solution` or `ground_truth`;
code tasks carry `tests`. Any other keys land in `metadata`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from django.db import transaction

from apps.buffer.models import Task, Taskset
from apps.buffer.pipeline import PipelineSession, pipeline_import_session
from apps.buffer.pipeline.core import Row
from apps.hygiene import InputRejected, jsonl_records, tree_check
from rftweb.exceptions import InvalidInput

# Operator steps as `{name, params}` mappings or config PipelineStep objects.
PipelineSteps = Sequence[Any] | None

PROMPT_KEYS = ("prompt", "question", "problem", "instruction")
REFERENCE_KEYS = ("answer", "reference", "solution", "ground_truth")
KNOWN = set(PROMPT_KEYS) | set(REFERENCE_KEYS) | {"messages", "tests", "domain", "metadata"}

Progress = Callable[[int, int | None], None]


class ImportFailed(InvalidInput):
    """The source could not be imported; nothing was written. Names the bad line or record:
    a message "where: what" names `where` as its field."""

    def __init__(self, message: str, *, field: str = "") -> None:
        where, sep, what = message.partition(": ")
        if not field and sep and what:
            field, message = where, what
        super().__init__(message, field=field)


def _messages_ok(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    )


def task_from_record(record: Any, *, where: str) -> dict[str, Any]:
    """Turn one source record into Task fields, or raise ImportFailed naming `where`."""
    if not isinstance(record, Mapping):
        raise ImportFailed(f"{where}: expected an object, got {type(record).__name__}")
    try:
        # What Postgres could not store (NUL, lone surrogates, NaN, deep nesting) is
        # refused here, naming the record and field, whichever door the record came by.
        tree_check(dict(record), root=where)
    except InputRejected as exc:
        field = exc.field if exc.field == where else f"{where}: {exc.field}"
        raise ImportFailed(f"{field}: {exc.message}") from None
    prompt: str = ""
    messages: list[dict[str, str]] | None = None
    raw = next((record[k] for k in PROMPT_KEYS if record.get(k) not in (None, "")), None)
    if raw is None and record.get("messages") is not None:
        raw = record["messages"]
    if isinstance(raw, str):
        prompt = raw
    elif raw is not None and _messages_ok(raw):
        messages = [{"role": m["role"], "content": m["content"]} for m in raw]
    elif raw is None:
        raise ImportFailed(f"{where}: no prompt (give one of {', '.join(PROMPT_KEYS)} or messages)")
    else:
        raise ImportFailed(f"{where}: the prompt must be text or a list of {{role, content}} messages")
    reference = next((record[k] for k in REFERENCE_KEYS if k in record), None)
    domain = record.get("domain") or "general"
    if not isinstance(domain, str) or len(domain) > 50:
        raise ImportFailed(f"{where}: domain must be text of at most 50 characters")
    metadata = dict(record.get("metadata") or {})
    metadata.update({k: v for k, v in record.items() if k not in KNOWN})
    try:
        json.dumps([reference, record.get("tests"), metadata])
    except (TypeError, ValueError) as exc:
        raise ImportFailed(f"{where}: a value is not JSON-serialisable ({exc})") from None
    return {"prompt": prompt, "messages": messages, "reference": reference, "tests": record.get("tests"), "domain": domain, "metadata": metadata}


def _jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    # Strict UTF-8, no NaN/Infinity, bounded depth: the line (and field) is named.
    with path.open("rb") as fh:
        try:
            yield from jsonl_records(fh)
        except InputRejected as exc:
            raise ImportFailed(str(exc)) from None


def _parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise ImportFailed(f"{path.name}: not a readable Parquet file ({exc})") from None
    row = 0
    for batch in pf.iter_batches(batch_size=2048):
        for record in batch.to_pylist():
            row += 1
            yield f"row {row}", record


def _hf_dataset(path: Path, split: str | None) -> Iterator[tuple[str, Any]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise ImportFailed(f"{path}: not a Hugging Face datasets directory ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split is None:
            split = "train" if "train" in ds else next(iter(ds))
        if split not in ds:
            raise ImportFailed(f"{path}: no split {split!r}; it has {', '.join(ds)}")
        ds = ds[split]
    for i, record in enumerate(ds, start=1):
        yield f"row {i}", record


def _records(path: Path, split: str | None) -> tuple[Iterator[tuple[str, Any]], int | None]:
    if path.is_dir():
        return _hf_dataset(path, split), None
    if path.suffix in {".jsonl", ".ndjson"}:
        return _jsonl(path), None
    if path.suffix in {".parquet", ".pq"}:
        import pyarrow.parquet as pq

        try:
            total = pq.ParquetFile(path).metadata.num_rows
        except Exception:
            total = None
        return _parquet(path), total
    raise ImportFailed(f"{path.name}: unsupported format; use .jsonl, .parquet or a datasets directory")


class _TaskWriter:
    """Passes chunks of task rows through the import pipeline and stores them, numbering
    them in order (synthesized tasks after the chunk that made them)."""

    def __init__(self, taskset: Taskset, session: PipelineSession) -> None:
        self.taskset = taskset
        self.session = session
        self.next_index = 0
        self.source_rows = 0

    def add(self, rows: Sequence[Row]) -> None:
        for row in rows:
            row["index"] = self.next_index
            self.next_index += 1
        self.source_rows += len(rows)
        given = len(rows)
        out = self.session.apply(list(rows))
        for row in out[given:]:
            row["index"] = self.next_index
            self.next_index += 1
        Task.objects.bulk_create([Task(taskset=self.taskset, **row) for row in out])


def _session(steps: PipelineSteps, run: Any, taskset: Taskset) -> PipelineSession:
    try:
        return pipeline_import_session(steps=steps, run=run, taskset_id=taskset.pk)
    except (ValueError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
        raise ImportFailed(f"pipeline: {exc}") from None


def taskset_import(
    *, name: str, path: str | Path, owner: Any = None, split: str | None = None, progress: Progress | None = None,
    pipeline: PipelineSteps = None, run: Any = None,
) -> Taskset:
    """Import a taskset in one transaction: every record lands, or none (ImportFailed).

    pipeline: on_import operators to apply (default: the run's `pipeline.on_import` when
    a run is given, else none). Tasks they filter are stored with their filter_reason (and
    never explored); tasks they synthesize are stored with is_synthetic=True.
    """
    path = Path(path)
    if not path.exists():
        raise ImportFailed(f"{path}: no such file or directory")
    records, total = _records(path, split)
    with transaction.atomic():
        taskset = Taskset.objects.create(name=name, owner=owner, source=str(path))
        session = _session(pipeline, run, taskset)
        writer = _TaskWriter(taskset, session)
        chunk: list[dict[str, Any]] = []
        count = 0
        for where, record in records:
            chunk.append(task_from_record(record, where=where))
            count += 1
            if len(chunk) >= 2000:
                writer.add(chunk)
                chunk = []
                if progress:
                    progress(count, total)
        writer.add(chunk)
        if count == 0:
            raise ImportFailed(f"{path.name}: no records")
        if progress:
            progress(count, total)
        transaction.on_commit(session.finish)
    taskset.pipeline_counts = session.counts  # type: ignore[attr-defined]
    return taskset


def taskset_create(
    *, name: str, records: list[Mapping[str, Any]], owner: Any = None, source: str = "",
    pipeline: PipelineSteps = None, run: Any = None,
) -> Taskset:
    """A taskset from in-memory records (forms, the API, tests); ImportFailed names the bad one.
    `pipeline` and `run` as for `taskset_import`."""
    rows = [task_from_record(r, where=f"record {i + 1}") for i, r in enumerate(records)]
    if not rows:
        raise ImportFailed("no records")
    with transaction.atomic():
        taskset = Taskset.objects.create(name=name, owner=owner, source=source)
        session = _session(pipeline, run, taskset)
        _TaskWriter(taskset, session).add(rows)
        transaction.on_commit(session.finish)
    taskset.pipeline_counts = session.counts  # type: ignore[attr-defined]
    return taskset
