"""Training data: exports of a run's buffer in the formats TRL's trainers read (an export's
*format*: sft, dpo, grpo, preferences; EXPORT_FORMATS), streamed row by row.

- `sft`:  {"messages": [...prompt messages, {"role": "assistant", "content": response}]}
          (SFTTrainer's conversational language-modeling format)
- `dpo`:  {"prompt": [...], "chosen": [{"role": "assistant", ...}], "rejected": [...]}
          (DPOTrainer's conversational preference format, with an explicit prompt): per group,
          the best and the worst completion by final reward, when they differ by more than
          `min_margin`; then every pair people stated with a label whose kind reaches training
          as preferences (A/B choices; apps.feedback.selectors.dpo_pairs) whose two
          completions pass the filters, whatever their rewards: a person's preference is the signal.
- `grpo`: {"prompt": [...], "answer": ..., "domain": ..., "task_id": ...} per task of the
          run's taskset (GRPOTrainer's prompt-only format; extra columns reach reward functions).

A run whose taskset has pictures exports `sft`, `dpo` and `grpo` in TRL's vision-language
format: every turn's content is a list of parts (`{"type": "image"}` before the text of the
user turn, `{"type": "text", "text": ...}`) and an `images` column holds the pictures in
order: in a datasets directory an `Image` feature with the bytes (what TRL's trainers load),
in JSONL the pictures' sha256 digests (fetch them at `/runs/<id>/images/<digest>/`).

Nothing here holds more than one chunk of rows (or one group for DPO) in memory: rows come
from a server-side cursor (`QuerySet.iterator`), JSONL is written line by line, and a Hugging
Face `datasets` directory is built with `Dataset.from_generator`, which writes Arrow batches
to disk as they come. The web side uses `export_jsonl_chunks` for a streamed download, the
CLI `export_jsonl` / `export_hf_dataset` with a progress bar.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

from django.db.models import QuerySet
from django.http import StreamingHttpResponse

from apps.buffer.images import image_bytes
from apps.buffer.models import Experience, Task, TasksetImage
from apps.feedback.reward_model.versions import gold_experience_ids
from apps.feedback.reward_model.preferences import preference_pairs
from apps.feedback.selectors import dpo_pairs
from apps.runs.models import Run
from kernel.exceptions import ExportFailed

if TYPE_CHECKING:
    from datasets import Features

EXPORT_FORMATS: tuple[str, ...] = ("sft", "dpo", "grpo", "preferences")
Progress = Callable[[int, int | None], None]
# A chat turn as the exports write it, and one exported row (written out as JSON).
Turn = dict[str, str]
ExportRow = dict[str, object]
N = TypeVar("N", int, float)

_CHUNK = 2000
# Statuses whose reward is final; pending ones wait for humans, filtered ones were dropped.
_FINAL = (Experience.Status.READY, Experience.Status.LEASED, Experience.Status.CONSUMED)


@dataclass(frozen=True)
class ExportOptions:
    min_reward: float | None = None
    min_version: int | None = None
    domain: str | None = None
    # DPO: the chosen reward must beat the rejected one by more than this.
    min_margin: float = 0.0
    statuses: tuple[str, ...] = field(default=tuple(_FINAL))


# The filters a download takes, by their form and query-string names.
EXPORT_FILTERS = ("min_reward", "min_version", "min_margin", "domain")


def export_options_parse(params: Mapping[str, object]) -> ExportOptions:
    """The options as a form or a query string gives them (min_reward, min_version,
    min_margin, domain; blank: unset), each refusal naming its field: the export page and
    the API read them alike."""

    def number(name: str, cast: type[N]) -> N | None:
        raw = str(params.get(name) or "").strip()
        if not raw:
            return None
        try:
            value = cast(raw)
        except ValueError:
            raise ExportFailed(f"{raw[:40]!r} is not {'a whole number' if cast is int else 'a number'}",
                               field=name) from None
        if cast is float and not math.isfinite(value):
            raise ExportFailed(f"{raw[:40]!r} is not a finite number", field=name)
        if cast is int and not -(2**63) <= value < 2**63:
            raise ExportFailed(f"{raw[:40]!r} is out of range", field=name)
        return value

    return ExportOptions(
        min_reward=number("min_reward", float),
        min_version=number("min_version", int),
        domain=str(params.get("domain") or "").strip() or None,
        min_margin=number("min_margin", float) or 0.0,
    )


@dataclass(frozen=True)
class ExportResult:
    format: str
    rows: int
    scanned: int
    path: Path | None = None


def _text_messages(value: object) -> list[Turn] | None:
    if isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    ):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    return None


def _prompt_messages(exp_messages: object, task_messages: object, prompt_text: str, task_prompt: str | None) -> list[Turn]:
    """The conversation up to the model's turn: the experience's own messages (without a
    trailing assistant turn), else the task's, else the prompt text as one user turn."""
    for candidate in (exp_messages, task_messages):
        msgs = _text_messages(candidate)
        if msgs:
            if msgs[-1]["role"] == "assistant":
                msgs = msgs[:-1]
            if msgs:
                return msgs
    return [{"role": "user", "content": prompt_text or task_prompt or ""}]


_EXP_FIELDS = (
    "id", "group_id", "prompt_text", "response_text", "messages", "reward",
    "is_expert", "model_version", "task__messages", "task__prompt", "task__images",
)
# The private key rows carry their pictures' digests under until `export_rows` shapes them.
_IMAGES = "_images"


def _experiences(*, run: Run, options: ExportOptions) -> QuerySet[Experience]:
    qs = Experience.objects.filter(run=run, status__in=options.statuses).exclude(response_text="")
    if options.min_version is not None:
        qs = qs.filter(model_version__gte=options.min_version)
    if options.domain:
        qs = qs.filter(task__domain=options.domain)
    return qs


def _sft_rows(*, run: Run, options: ExportOptions, progress: Progress | None) -> Iterator[ExportRow]:
    from django.db.models import Q

    qs = _experiences(run=run, options=options)
    if options.min_reward is not None:
        # Expert experiences (human corrections) are good answers whatever their reward.
        qs = qs.filter(Q(reward__gte=options.min_reward) | Q(is_expert=True))
    total = qs.count()
    done = 0
    for row in qs.order_by("id").values_list(*_EXP_FIELDS).iterator(chunk_size=_CHUNK):
        _, _, prompt_text, response, messages, _, _, _, task_messages, task_prompt, images = row
        done += 1
        prompt = _prompt_messages(messages, task_messages, prompt_text, task_prompt)
        yield {"messages": [*prompt, {"role": "assistant", "content": response}], _IMAGES: images or []}
        if progress and done % _CHUNK == 0:
            progress(done, total)
    if progress:
        progress(done, total)


def _dpo_rows(*, run: Run, options: ExportOptions, progress: Progress | None) -> Iterator[ExportRow]:
    qs = _experiences(run=run, options=options).filter(reward__isnull=False)
    total = qs.count()
    done = 0
    paired: set[tuple[int, int]] = set()

    def pair(members: list[tuple[Any, ...]]) -> ExportRow | None:
        if len(members) < 2:
            return None
        # Ties go to the earliest row both ways, so one row never plays both parts.
        best = max(members, key=lambda m: (m[5], -m[0]))
        worst = min(members, key=lambda m: (m[5], m[0]))
        if best[0] == worst[0] or best[5] - worst[5] <= options.min_margin:
            return None
        if options.min_reward is not None and best[5] < options.min_reward:
            return None
        prompt = _prompt_messages(best[4], best[8], best[2], best[9])
        paired.add((best[0], worst[0]))
        return {
            "prompt": prompt,
            "chosen": [{"role": "assistant", "content": best[3]}],
            "rejected": [{"role": "assistant", "content": worst[3]}],
            _IMAGES: best[10] or [],
        }

    group: list[tuple[Any, ...]] = []
    for row in qs.order_by("group_id", "id").values_list(*_EXP_FIELDS).iterator(chunk_size=_CHUNK):
        done += 1
        if group and row[1] != group[0][1]:
            made = pair(group)
            if made:
                yield made
            group = []
        group.append(row)
        if progress and done % _CHUNK == 0:
            progress(done, total)
    made = pair(group)
    if made:
        yield made
    if progress:
        progress(done, total)
    yield from _pairwise_rows(run=run, options=options, skip=paired)


def _pairwise_rows(*, run: Run, options: ExportOptions, skip: set[tuple[int, int]]) -> Iterator[ExportRow]:
    """Pairs people stated (A/B choices, and any kind whose labels reach training as
    preferences; late ones included), oldest first. Choices are human-made, so all of them
    and their completions fit in memory at once."""
    choices = [c for c in dpo_pairs(run=run) if (c.chosen_id, c.rejected_id) not in skip]
    ids = {pk for c in choices for pk in (c.chosen_id, c.rejected_id)}
    fields = ("id", "prompt_text", "response_text", "messages", "task__messages", "task__prompt", "task__images")
    eligible = {r["id"]: r for r in _experiences(run=run, options=options).filter(pk__in=ids).values(*fields)}
    for choice in choices:
        chosen, rejected = eligible.get(choice.chosen_id), eligible.get(choice.rejected_id)
        if chosen is None or rejected is None or (choice.chosen_id, choice.rejected_id) in skip:
            continue
        skip.add((choice.chosen_id, choice.rejected_id))
        yield {
            "prompt": _prompt_messages(chosen["messages"], chosen["task__messages"], chosen["prompt_text"],
                                       chosen["task__prompt"]),
            "chosen": [{"role": "assistant", "content": chosen["response_text"]}],
            "rejected": [{"role": "assistant", "content": rejected["response_text"]}],
            _IMAGES: chosen["task__images"] or [],
        }


def _reference_text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _grpo_rows(*, run: Run, options: ExportOptions, progress: Progress | None) -> Iterator[ExportRow]:
    if run.taskset_id is None:
        raise ExportFailed(f"run {run.pk} has no taskset to export prompts from")
    qs = Task.objects.filter(taskset_id=run.taskset_id, filter_reason="")
    if options.domain:
        qs = qs.filter(domain=options.domain)
    total = qs.count()
    done = 0
    for pk, prompt, messages, reference, domain, images in (
        qs.order_by("index").values_list("id", "prompt", "messages", "reference", "domain", "images")
        .iterator(chunk_size=_CHUNK)
    ):
        done += 1
        yield {
            "prompt": _prompt_messages(None, messages, prompt, None),
            "answer": _reference_text(reference),
            "domain": domain,
            "task_id": pk,
            _IMAGES: images or [],
        }
        if progress and done % _CHUNK == 0:
            progress(done, total)
    if progress:
        progress(done, total)


def _preference_rows(*, run: Run, options: ExportOptions, progress: Progress | None) -> Iterator[ExportRow]:
    """Every preference people expressed (ratings within a group, rankings, A/B choices, edits
    over their originals; apps.feedback.reward_model.preferences), in TRL's conversational preference
    format: what the run's reward model learns from. Gold items are left out."""

    pairs = preference_pairs(run=run, exclude_experience_ids=gold_experience_ids(run=run))
    for done, pair in enumerate(pairs, start=1):
        if options.min_margin and pair.margin <= options.min_margin:
            continue
        yield {
            "prompt": [{"role": "user", "content": pair.prompt}],
            "chosen": [{"role": "assistant", "content": pair.chosen}],
            "rejected": [{"role": "assistant", "content": pair.rejected}],
        }
        if progress and done % _CHUNK == 0:
            progress(done, len(pairs))
    if progress:
        progress(len(pairs), len(pairs))


_ROWS = {"sft": _sft_rows, "dpo": _dpo_rows, "grpo": _grpo_rows, "preferences": _preference_rows}


def export_is_vision(*, run: Run, export_format: str) -> bool:
    """Whether the export is in TRL's vision-language format: a run whose taskset has pictures."""
    return export_format in ("sft", "dpo", "grpo") and run.taskset_id is not None and \
        TasksetImage.objects.filter(taskset_id=run.taskset_id).exists()


def _parts(turns: list[Turn], *, pictures: int) -> list[dict[str, object]]:
    """Turns with content parts; the pictures go before the text of the last user turn."""
    last_user = max((i for i, t in enumerate(turns) if t["role"] == "user"), default=-1)
    out: list[dict[str, object]] = []
    for i, turn in enumerate(turns):
        parts: list[dict[str, object]] = [{"type": "image", "text": None}] * pictures if i == last_user else []
        out.append({"role": turn["role"], "content": [*parts, {"type": "text", "text": turn["content"]}]})
    return out


def _vision_row(row: ExportRow, *, embed: bool) -> ExportRow:
    digests = list(cast(Iterable[str], row.pop(_IMAGES)))
    shaped: ExportRow = {k: _parts(cast(list[Turn], v), pictures=len(digests) if k in ("messages", "prompt") else 0)
              if k in ("messages", "prompt", "chosen", "rejected") else v for k, v in row.items()}
    shaped["images"] = [{"bytes": image_bytes(d), "path": d} for d in digests] if embed else digests
    return shaped


def export_format_check(export_format: str) -> None:
    """Refuse a format that is not one of EXPORT_FORMATS, naming the `format` field."""
    if export_format not in _ROWS:
        raise ExportFailed(f"unknown export format {export_format!r}; use one of {', '.join(EXPORT_FORMATS)}",
                           field="format")


def export_rows(
    *, run: Run, export_format: str, options: ExportOptions | None = None, progress: Progress | None = None,
    embed_images: bool = False,
) -> Iterator[dict[str, Any]]:  # JSON of the format's known shape, read as such
    """The export's rows, one at a time. `progress(done, total)` counts source rows read.
    `embed_images`: a vision export's `images` hold the bytes (a datasets directory), not digests."""
    export_format_check(export_format)
    rows = _ROWS[export_format](run=run, options=options or ExportOptions(), progress=progress)
    if export_is_vision(run=run, export_format=export_format):
        return (_vision_row(row, embed=embed_images) for row in rows)
    return ({k: v for k, v in row.items() if k != _IMAGES} for row in rows)


def _line(row: ExportRow) -> bytes:
    return (json.dumps(row, ensure_ascii=False) + "\n").encode()


def export_jsonl_chunks(
    *, run: Run, export_format: str, options: ExportOptions | None = None, chunk_bytes: int = 64 * 1024
) -> Iterator[bytes]:
    """JSONL bytes in chunks of about `chunk_bytes`, for a streamed HTTP download."""
    rows = export_rows(run=run, export_format=export_format, options=options)  # raises ExportFailed before streaming starts

    def chunks() -> Iterator[bytes]:
        buf: list[bytes] = []
        size = 0
        for row in rows:
            line = _line(row)
            buf.append(line)
            size += len(line)
            if size >= chunk_bytes:
                yield b"".join(buf)
                buf, size = [], 0
        if buf:
            yield b"".join(buf)

    return chunks()


def export_jsonl_response(*, run: Run, export_format: str, options: ExportOptions) -> StreamingHttpResponse:
    """The streamed JSONL download the export page and the API both serve (the same bytes).
    Raises ExportFailed before anything is sent: each door answers it in its own way."""
    response = StreamingHttpResponse(export_jsonl_chunks(run=run, export_format=export_format, options=options),
                                     content_type="application/jsonl; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{export_format}.jsonl"'
    response["X-Accel-Buffering"] = "no"  # a proxy passes chunks on as they come
    return response


@dataclass
class _Counting:
    """A progress callback that keeps how many rows were scanned and passes the count on."""

    then: Progress | None = None
    scanned: int = 0

    def __call__(self, done: int, total: int | None) -> None:
        self.scanned = done
        if self.then:
            self.then(done, total)


def export_jsonl(
    *, run: Run, export_format: str, out: str | Path | IO[bytes], options: ExportOptions | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Write the export as JSONL to a path (atomically: a temp file renamed at the end) or a
    binary stream."""
    counting = _Counting(progress)
    rows = export_rows(run=run, export_format=export_format, options=options, progress=counting)
    written = 0
    if isinstance(out, (str, Path)):
        path = Path(out)
        if path.is_dir():
            raise ExportFailed(f"{path} is a directory; give a file name ending in .jsonl")
        if not path.parent.exists():
            raise ExportFailed(f"{path.parent}: no such directory")
        tmp = path.with_name(f".{path.name}.partial")
        try:
            with tmp.open("wb") as fh:
                for row in rows:
                    fh.write(_line(row))
                    written += 1
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return ExportResult(format=export_format, rows=written, scanned=counting.scanned, path=path)
    for row in rows:
        out.write(_line(row))
        written += 1
    return ExportResult(format=export_format, rows=written, scanned=counting.scanned)


def _features(export_format: str, *, vision: bool = False) -> Features:
    from datasets import Features, Image, List, Value

    if vision:
        turn = {"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})}
        images = {"images": List(Image())}
    else:
        turn = {"role": Value("string"), "content": Value("string")}
        images = {}
    if export_format == "sft":
        return Features({"messages": List(turn), **images})
    if export_format in ("dpo", "preferences"):
        return Features({"prompt": List(turn), "chosen": List(turn), "rejected": List(turn), **images})
    return Features({"prompt": List(turn), "answer": Value("string"), "domain": Value("string"), "task_id": Value("int64"),
                     **images})


def _generate(run_id: int, export_format: str, options: dict[str, Any], progress: Progress | None) -> Iterator[ExportRow]:
    run = Run.objects.get(pk=run_id)
    opts = ExportOptions(**{**options, "statuses": tuple(options["statuses"])})
    yield from export_rows(run=run, export_format=export_format, options=opts, progress=progress, embed_images=True)


def export_hf_dataset(
    *, run: Run, export_format: str, out_dir: str | Path, options: ExportOptions | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Write a Hugging Face `datasets` directory (`datasets.load_from_disk` reads it)."""
    import datasets

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ExportFailed(f"{out} exists and is not empty")
    export_format_check(export_format)
    if export_format == "grpo" and run.taskset_id is None:
        raise ExportFailed(f"run {run.pk} has no taskset to export prompts from")
    out.parent.mkdir(parents=True, exist_ok=True)
    # A private cache per export: from_generator would otherwise reuse an earlier export's
    # cached Arrow file for the same arguments even though the buffer has changed since.
    cache = Path(tempfile.mkdtemp(prefix=".export-cache-", dir=out.parent))
    counting = _Counting(progress)
    try:
        opts = asdict(options or ExportOptions())
        was_enabled = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bar()
        try:
            ds = datasets.Dataset.from_generator(
                _generate,
                features=_features(export_format, vision=export_is_vision(run=run, export_format=export_format)),
                cache_dir=str(cache),
                gen_kwargs={"run_id": run.pk, "export_format": export_format, "options": opts, "progress": counting},
            )
            ds.save_to_disk(str(out))
        finally:
            if was_enabled:
                datasets.enable_progress_bar()
        rows = len(ds)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return ExportResult(format=export_format, rows=rows, scanned=counting.scanned, path=out)
