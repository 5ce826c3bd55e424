"""Taskset import from JSONL, Parquet or a local Hugging Face `datasets` directory.

Each record needs a prompt: `prompt` (text or chat messages) or `messages`, or `question`.
The reference answer comes from `answer`, `reference`, `solution` or `ground_truth`;
code tasks carry `tests`. Any other keys land in `metadata`.

Pictures (`image`: one, `images`: a list) come as paths inside a `.zip` that holds the JSONL
beside them, as a Parquet binary or struct column (`{bytes, path}`, the Hugging Face Image
encoding), or as an `Image` feature of a datasets directory. Each is checked and stored once
in the image store (apps/buffer/images.py); the task keeps its digests.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from django.db import transaction

from apps.buffer.models import Task, Taskset, TasksetImage
from apps.buffer.pipeline import PipelineSession, pipeline_import_session
from kernel.operators import Row
from kernel.input_checks import InputRejected, jsonl_records, tree_check
from kernel.plugin_names import domain_misspelt, domain_misspelt_message
from kernel.exceptions import InvalidInput
from apps.buffer.images import ImageRejected, image_store

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from kernel.config import PipelineStep
    from apps.runs.models import Run

# Operator steps as `{name, params}` mappings or config PipelineStep objects.
PipelineSteps = Sequence["PipelineStep | Mapping[str, object]"] | None
# A record as read from the source (checked by task_from_record).
Records = Iterator[tuple[str, object]]

PROMPT_KEYS = ("prompt", "question", "problem", "instruction")
REFERENCE_KEYS = ("answer", "reference", "solution", "ground_truth")
IMAGE_KEYS = ("image", "images")
KNOWN = set(PROMPT_KEYS) | set(REFERENCE_KEYS) | {"messages", "tests", "domain", "metadata"} | set(IMAGE_KEYS)

Progress = Callable[[int, int | None], None]


class TaskFields(TypedDict):
    """A record as Task fields (task_from_record); the import adds `images` and `index`."""

    prompt: str
    messages: list[dict[str, str]] | None
    reference: object
    tests: object
    domain: str
    metadata: dict[str, object]
    images: NotRequired[list[str]]


class ImportFailed(InvalidInput):
    """The source could not be imported; nothing was written. Names the bad line or record:
    a message "where: what" names `where` as its field."""

    code = "import_failed"

    def __init__(self, message: str, *, field: str = "") -> None:
        where, sep, what = message.partition(": ")
        if not field and sep and what:
            field, message = where, what
        super().__init__(message, field=field)


def _messages_ok(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    )


def task_from_record(record: object, *, where: str) -> TaskFields:
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

    known = domain_misspelt(domain)
    if known is not None:
        raise ImportFailed(f"{where}: {domain_misspelt_message(domain, known)}")
    metadata = dict(record.get("metadata") or {})
    metadata.update({k: v for k, v in record.items() if k not in KNOWN})
    try:
        json.dumps([reference, record.get("tests"), metadata])
    except (TypeError, ValueError) as exc:
        raise ImportFailed(f"{where}: a value is not JSON-serialisable ({exc})") from None
    return {"prompt": prompt, "messages": messages, "reference": reference, "tests": record.get("tests"), "domain": domain, "metadata": metadata}


def _jsonl(path: Path) -> Records:
    # Strict UTF-8, no NaN/Infinity, bounded depth: the line (and field) is named.
    with path.open("rb") as fh:
        try:
            yield from jsonl_records(fh)
        except InputRejected as exc:
            raise ImportFailed(str(exc)) from None


def _parquet(path: Path) -> Records:
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


def _zip_jsonl(zf: zipfile.ZipFile, name: str) -> Records:
    with zf.open(name) as fh:
        try:
            for where, record in jsonl_records(fh):
                yield f"{name} {where}", record
        except InputRejected as exc:
            raise ImportFailed(f"{name} {exc}") from None


class _Pictures:
    """Turns a record's picture values into bytes: zip members (the zip's JSONL), or the
    bytes a Parquet column or datasets Image feature carries."""

    def __init__(self, zf: zipfile.ZipFile | None = None) -> None:
        self.zf = zf
        self.members = set(zf.namelist()) if zf is not None else set()

    def read(self, value: object, *, where: str) -> tuple[bytes, str]:
        if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
            data, name = value.get("bytes"), str(value.get("path") or "image")
            if isinstance(data, (bytes, bytearray)):
                return bytes(data), name
            raise ImportFailed(f"{where}: image {name!r} carries no bytes (embed the pictures in the file)")
        if isinstance(value, (bytes, bytearray)):
            return bytes(value), "image"
        if isinstance(value, str):
            if self.zf is None:
                raise ImportFailed(f"{where}: image {value!r} is a path; put the JSONL and its pictures in one .zip")
            if value not in self.members:
                raise ImportFailed(f"{where}: image {value!r} is not in the zip")
            return self.zf.read(value), value
        raise ImportFailed(f"{where}: an image must be a path inside the zip or image bytes, got {type(value).__name__}")


def _pictures_of(record: object, *, where: str) -> tuple[object, list[object]]:
    """(the record without its picture keys, the picture values in order)."""
    if not isinstance(record, Mapping) or not any(k in record for k in IMAGE_KEYS):
        return record, []
    rest = {k: v for k, v in record.items() if k not in IMAGE_KEYS}
    values: list[object] = []
    single, many = record.get("image"), record.get("images")
    if single is not None:
        values.append(single)
    if many is not None:
        if not isinstance(many, (list, tuple)):
            raise ImportFailed(f"{where}: images must be a list")
        values.extend(many)
    return rest, values


def _hf_dataset(path: Path, split: str | None) -> Records:
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
    for column in IMAGE_KEYS:
        feature = ds.features.get(column)
        # The encoded bytes, not decoded PIL pictures: checked and stored as they are.
        if isinstance(feature, datasets.Image):
            ds = ds.cast_column(column, datasets.Image(decode=False))
        elif isinstance(feature, (datasets.Sequence, datasets.List)) and isinstance(getattr(feature, "feature", None), datasets.Image):
            ds = ds.cast_column(column, type(feature)(datasets.Image(decode=False)))
    for i, record in enumerate(ds, start=1):
        yield f"row {i}", record


def _records(path: Path, split: str | None) -> tuple[Records, int | None, _Pictures]:
    if path.is_dir():
        return _hf_dataset(path, split), None, _Pictures()
    if path.suffix in {".jsonl", ".ndjson"}:
        return _jsonl(path), None, _Pictures()
    if path.suffix == ".zip":
        try:
            zf = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ImportFailed(f"{path.name}: not a readable zip ({exc})") from None
        found = sorted(n for n in zf.namelist() if n.endswith((".jsonl", ".ndjson")) and not n.startswith("__MACOSX/"))
        if len(found) != 1:
            raise ImportFailed(f"{path.name}: the zip must hold exactly one .jsonl file (it holds {len(found)})")
        return _zip_jsonl(zf, found[0]), None, _Pictures(zf)
    if path.suffix in {".parquet", ".pq"}:
        import pyarrow.parquet as pq

        try:
            total = pq.ParquetFile(path).metadata.num_rows
        except Exception:
            total = None
        return _parquet(path), total, _Pictures()
    raise ImportFailed(f"{path.name}: unsupported format; use .jsonl, .zip (JSONL and its pictures), .parquet or a datasets directory")


class _TaskWriter:
    """Passes chunks of task rows through the import pipeline and stores them, numbering
    them in order (synthesized tasks after the chunk that made them)."""

    def __init__(self, taskset: Taskset, session: PipelineSession) -> None:
        self.taskset = taskset
        self.session = session
        self.next_index = 0
        self.source_rows = 0
        self.images: dict[str, TasksetImage] = {}

    def add(self, fields: Sequence[TaskFields]) -> None:
        # A TaskFields is a plain dict: the operators see it as a row they may add fields to.
        rows = cast(list[Row], list(fields))
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

    def pictures(self, pictures: _Pictures, values: list[object], *, where: str) -> list[str]:
        """Store a record's pictures (once each) and return their digests in order."""
        digests = []
        for value in values:
            data, name = pictures.read(value, where=where)
            try:
                info = image_store(data=data, name=name)
            except ImageRejected as exc:
                raise ImportFailed(f"{where}: {exc.message}") from None
            if info.sha256 not in self.images:
                self.images[info.sha256] = TasksetImage(
                    taskset=self.taskset, sha256=info.sha256, content_type=info.content_type, width=info.width,
                    height=info.height, size=info.size, name=info.name,
                )
            digests.append(info.sha256)
        return digests

    def finish(self) -> None:
        TasksetImage.objects.bulk_create(list(self.images.values()))


def _session(steps: PipelineSteps, run: Run | None, taskset: Taskset) -> PipelineSession:
    try:
        return pipeline_import_session(steps=steps, run=run, taskset_id=taskset.pk)
    except (ValueError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
        raise ImportFailed(f"pipeline: {exc}") from None


def taskset_import(
    *, name: str, path: str | Path, owner: Any = None, split: str | None = None,
    progress: Progress | None = None, pipeline: PipelineSteps = None, run: Run | None = None,
) -> Taskset:
    """Import a taskset in one transaction: every record lands, or none (ImportFailed).

    pipeline: on_import operators to apply (default: the run's `pipeline.on_import` when
    a run is given, else none). Tasks they filter are stored with their filter_reason (and
    never explored); tasks they synthesize are stored with is_synthetic=True.
    """
    path = Path(path)
    if not path.exists():
        raise ImportFailed(f"{path}: no such file or directory")
    records, total, pictures = _records(path, split)
    with transaction.atomic():
        taskset = Taskset.objects.create(name=name, owner=owner, source=str(path))
        session = _session(pipeline, run, taskset)
        writer = _TaskWriter(taskset, session)
        count = 0
        for chunk, count, full in _task_chunks(records, writer, pictures, size=2000):
            writer.add(chunk)
            if full and progress:
                progress(count, total)
        writer.finish()
        if count == 0:
            raise ImportFailed(f"{path.name}: no records")
        if progress:
            progress(count, total)
        transaction.on_commit(session.finish)
    taskset.pipeline_counts = session.counts
    return taskset


def _task_chunks(
    records: Records, writer: _TaskWriter, pictures: _Pictures, *, size: int,
) -> Iterator[tuple[list[TaskFields], int, bool]]:
    """Task rows from `records` in chunks of `size`: (rows, records read so far, whether the
    chunk is full). The last chunk (possibly empty) comes with full=False."""
    chunk: list[TaskFields] = []
    count = 0
    for where, record in records:
        record, values = _pictures_of(record, where=where)
        row = task_from_record(record, where=where)
        if values:
            row["images"] = writer.pictures(pictures, values, where=where)
        chunk.append(row)
        count += 1
        if len(chunk) >= size:
            yield chunk, count, True
            chunk = []
    yield chunk, count, False


def taskset_create(
    *, name: str, records: Sequence[Mapping[str, object]], owner: Any = None, source: str = "",
    pipeline: PipelineSteps = None, run: Run | None = None,
) -> Taskset:
    """A taskset from in-memory records (forms, the API, tests); ImportFailed names the bad one.
    `pipeline` and `run` as for `taskset_import`."""
    split = [_pictures_of(r, where=f"record {i + 1}") for i, r in enumerate(records)]
    rows = [task_from_record(r, where=f"record {i + 1}") for i, (r, _) in enumerate(split)]
    if not rows:
        raise ImportFailed("no records")
    with transaction.atomic():
        taskset = Taskset.objects.create(name=name, owner=owner, source=source)
        session = _session(pipeline, run, taskset)
        writer = _TaskWriter(taskset, session)
        for i, (row, (_, values)) in enumerate(zip(rows, split, strict=True)):
            if values:
                # In-memory records carry bytes (or {bytes, path}); paths need a zip import.
                row["images"] = writer.pictures(_Pictures(), values, where=f"record {i + 1}")
        writer.add(rows)
        writer.finish()
        transaction.on_commit(session.finish)
    taskset.pipeline_counts = session.counts
    return taskset


# --- background imports (uploads past RFT_UPLOAD_BACKGROUND_BYTES) ------------------------

BACKGROUND_CHUNK = 2000


def _records_total(path: Path, total: int | None) -> int | None:
    """Rows in all, for the progress: Parquet says so; a JSONL file's non-blank lines are
    counted first (one pass over bytes, far cheaper than the import)."""
    if total is not None or path.suffix not in {".jsonl", ".ndjson"}:
        return total
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


def taskset_import_claim(*, taskset_id: int, stale_seconds: float) -> bool:
    """Take the taskset's import (queued → importing) by a conditional UPDATE: of any number
    of deliveries of the task, one wins. An `importing` claim older than `stale_seconds`
    (the task's hard time limit: its worker died) may be taken again."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    now = timezone.now()
    free = Q(import_status=Taskset.Import.QUEUED) | Q(
        import_status=Taskset.Import.IMPORTING, import_started_at__lt=now - timedelta(seconds=stale_seconds))
    return bool(Taskset.objects.filter(free, pk=taskset_id).update(
        import_status=Taskset.Import.IMPORTING, import_started_at=now, import_rows=0, import_error=""))


def taskset_import_background(*, taskset_id: int) -> Taskset:
    """Import a claimed taskset's stored file in committed chunks, writing rows read / total
    on the taskset after each, so the run page and the API can show it. Idempotent: tasks of
    an earlier, interrupted try are removed first. On ImportFailed (or any error) the tasks
    are removed again and the taskset is marked failed with the message (naming the line);
    the stored file is removed either way."""
    taskset = Taskset.objects.get(pk=taskset_id)
    path = Path(taskset.source)
    Task.objects.filter(taskset=taskset).delete()
    TasksetImage.objects.filter(taskset=taskset).delete()
    try:
        if not path.exists():
            raise ImportFailed(f"{path.name}: the uploaded file is gone; upload it again")
        records, total, pictures = _records(path, None)
        total = _records_total(path, total)
        Taskset.objects.filter(pk=taskset_id).update(import_total=total)
        session = _session(None, None, taskset)
        writer = _TaskWriter(taskset, session)
        count = 0
        last: list[TaskFields] = []
        for chunk, count, full in _task_chunks(records, writer, pictures, size=BACKGROUND_CHUNK):
            if not full:
                last = chunk  # the remainder commits with the taskset's final state below
                break
            with transaction.atomic():
                writer.add(chunk)
                Taskset.objects.filter(pk=taskset_id).update(import_rows=count)
        if count == 0:
            raise ImportFailed(f"{path.name}: no records")
        with transaction.atomic():
            writer.add(last)
            writer.finish()
            Taskset.objects.filter(pk=taskset_id).update(
                import_rows=count, import_total=count, import_status=Taskset.Import.READY, import_error="")
            transaction.on_commit(session.finish)
    except Exception as exc:
        message = str(exc) if isinstance(exc, ImportFailed) else f"the import stopped: {type(exc).__name__}: {exc}"
        with transaction.atomic():
            Task.objects.filter(taskset=taskset).delete()
            TasksetImage.objects.filter(taskset=taskset).delete()
            Taskset.objects.filter(pk=taskset_id).update(import_status=Taskset.Import.FAILED, import_error=message[:2000])
        if not isinstance(exc, ImportFailed):
            raise
    finally:
        path.unlink(missing_ok=True)
    taskset.refresh_from_db()
    return taskset
