"""What operators see: rows (plain mutable mappings) and a context that counts what they do.

An operator is a plain function `fn(rows, ctx, params) -> list[new rows] | None` over the
rows that are still live (not filtered by an earlier step). It removes a row by
`ctx.drop(row, reason)`: the row keeps its reason (`filter_reason`) and is stored, never
trained. It changes a row by assigning its fields. It adds rows (synthesis) by returning
them.

Rows at each stage:
- write: the experience dicts passed to `experience_write`, before validation, so an
  operator must leave alone what it does not understand (validation rejects it after);
- import: Task field dicts (`prompt`, `messages`, `reference`, `domain`, `metadata`, ...);
- claim: `ModelRow`s over the claimed `Experience` instances (field names are attnames).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeGuard, TypeVar

from apps.buffer.pipeline.registry import operator_get, params_parse

if TYPE_CHECKING:
    from django.db import models

    from kernel.config import PipelineStep, RunConfig

# A row's values are whatever the stage carries (unvalidated input on write): operators
# check what they read.
Row = MutableMapping[str, Any]
M = TypeVar("M", bound="models.Model")

FILTER_REASON_MAX = 200


@dataclass
class Ctx:
    stage: str
    run_id: int | None = None
    taskset_id: int | None = None
    now: datetime | None = None
    counts: Counter[str] = field(default_factory=Counter)
    # Work to do once the rows are stored (the transaction committed): DB updates of other
    # tables, worker tasks to enqueue.
    after: list[Callable[[], None]] = field(default_factory=list)
    # Operator state kept across calls of one session (an import applies per chunk).
    state: dict[int, dict[str, Any]] = field(default_factory=dict)
    op: str = ""
    step_index: int = 0
    # The run's config when there is one (operators read e.g. sampling from it).
    run_cfg: RunConfig | None = None

    def count(self, reason: str, n: int = 1) -> None:
        if n:
            self.counts[f"{self.op}/{reason}"] += n

    def drop(self, row: Row, reason: str, detail: str = "") -> None:
        text = f"{reason}: {detail}" if detail else reason
        row["filter_reason"] = text[:FILTER_REASON_MAX]
        self.count(reason)

    @property
    def my_state(self) -> dict[str, Any]:
        return self.state.setdefault(self.step_index, {})

    def metric_values(self) -> dict[str, float]:
        return {f"pipeline/{self.stage}/{k}": float(v) for k, v in sorted(self.counts.items())}


class ModelRow(MutableMapping[str, object], Generic[M]):
    """A model instance seen as a row; remembers which fields an operator changed."""

    def __init__(self, instance: M) -> None:
        self.instance = instance
        self.dirty: set[str] = set()
        self._names = {f.attname for f in instance._meta.concrete_fields}

    def __getitem__(self, key: str) -> object:
        if key not in self._names:
            raise KeyError(key)
        return getattr(self.instance, key)

    def __setitem__(self, key: str, value: object) -> None:
        if key not in self._names:
            raise KeyError(f"{type(self.instance).__name__} has no field {key!r}")
        setattr(self.instance, key, value)
        self.dirty.add(key)

    def __delitem__(self, key: str) -> None:
        raise TypeError("fields of a stored row cannot be deleted")

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def steps_apply(steps: Sequence[PipelineStep], rows: list[Row], ctx: Ctx) -> list[Row]:
    """Run the configured steps in order over `rows`; returns them plus any added rows."""
    for index, step in enumerate(steps):
        spec = operator_get(step.name)
        params = params_parse(step.name, dict(step.params))
        ctx.op, ctx.step_index = step.name, index
        live = [r for r in rows if not r.get("filter_reason")]
        added = spec.fn(live, ctx, params)
        if added:
            rows.extend(added)
            ctx.count("added", len(added))
    return rows


# Small helpers for reading raw rows defensively (the write stage sees unvalidated input).

def row_pk(value: object) -> object:
    return getattr(value, "pk", value)


def row_get(row: Row, name: str, alias: str | None = None) -> object:
    if name in row:
        return row_pk(row[name])
    return row_pk(row[alias]) if alias and alias in row else None


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def response_tokens(row: Row) -> int | None:
    """Response length in tokens, or None when the row's tokens are malformed."""
    ids = row.get("token_ids")
    prompt_length = row.get("prompt_length", 0) or 0
    if not isinstance(ids, list) or not isinstance(prompt_length, int):
        return None
    return max(0, len(ids) - prompt_length)


def metadata_set(row: Row, **values: object) -> None:
    """Add keys to a row's metadata by assignment (so a ModelRow records the change)."""
    meta = row.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta.update(values)
    row["metadata"] = meta


def task_text(row: Row) -> str:
    """A task's prompt as one text (chat messages joined), for hashing and matching."""
    if row.get("prompt"):
        return str(row["prompt"])
    messages = row.get("messages") or []
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages if isinstance(m, dict))
