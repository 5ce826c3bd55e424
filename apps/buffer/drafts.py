"""The one typed experience every producer builds: `ExperienceDraft`.

The explorer, the environment API, human corrections, imports and the test factories all
construct an `ExperienceDraft`, and `experience_write` accepts nothing else. Its
constructor owns the checks a stored experience must pass, so no caller repeats them:

- lengths: `logprobs` and `action_mask` cover the response (token_ids minus prompt_length);
- numbers: rewards, reward parts, priority and logprobs are finite (no NaN, no inf);
- text: NUL, which model output can hold and Postgres text/jsonb cannot, becomes U+FFFD in
  prompt_text, response_text, messages and metadata (the token ids keep what was sampled);
- column limits: key, group_id, finish_reason, filter_reason fit their columns;
- status: never leased or consumed; `ExperienceDraft.scored` sets the initial status and
  rewards from the run's feedback settings.

A malformed draft raises `InvalidInput` naming the field; nothing is written. The same
object gives the row that is stored and the payload of its `experience.created` event.

Why a Mapping too: the data pipeline's write-stage operators work on plain rows; a draft
reads as one (`dict(draft)`), and what they hand back is checked again by `from_row`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard, TypeVar, cast

from kernel.config import RunConfig
from kernel.fold import InitialFields, experience_initial_fields
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

T = TypeVar("T")

STATUSES = ("pending", "ready", "leased", "consumed", "filtered")
WRITABLE_STATUSES = ("pending", "ready", "filtered")
SOURCES = ("explorer", "env", "human", "import", "synthetic")
KEY_MAX, GROUP_MAX, FINISH_MAX, FILTER_MAX = 200, 100, 20, 200
# Old spellings a row may use for the foreign keys (and model instances as their values).
_ALIASES = {"run": "run_id", "task": "task_id", "parent": "parent_id"}


def without_nul(value: T) -> T:
    """`value` with every NUL in its text (nested too) replaced by U+FFFD (of the same shape:
    text stays text, lists lists, dicts dicts)."""
    if isinstance(value, str):
        return cast(T, value.replace("\x00", "\ufffd")) if "\x00" in value else value
    if isinstance(value, list):
        return cast(T, [without_nul(v) for v in value])
    if isinstance(value, dict):
        return cast(T, {without_nul(k): without_nul(v) for k, v in value.items()})
    return value


def _finite(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(eq=True, slots=True)
class ExperienceDraft(Mapping[str, object]):
    """An experience about to be written (see the module docstring). Treat it as
    immutable: `dataclasses.replace(draft, …)` makes a changed copy, checked again."""

    run_id: int
    key: str
    group_id: str
    prompt_text: str = ""
    response_text: str = ""
    messages: Sequence[Mapping[str, object]] | None = None
    # prompt followed by response; logprobs and action_mask cover the response part only.
    token_ids: list[int] = field(default_factory=list)
    prompt_length: int = 0
    logprobs: list[float] | None = None
    action_mask: list[int] | None = None
    finish_reason: str = ""
    task_id: int | None = None
    source: str = "explorer"
    reward: float | None = None
    auto_reward: float | None = None
    human_reward: float | None = None
    reward_parts: dict[str, float] = field(default_factory=dict)
    model_version: int = 0
    is_expert: bool = False
    parent_id: int | None = None
    status: str = "ready"
    filter_reason: str = ""
    # None: the writer chose none (the run's pipeline may set one; stored as 0.0).
    priority: float | None = None
    metadata: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def bad(name: str, message: str) -> InvalidInput:
            return InvalidInput(message, field=name)

        for name in ("run_id", "model_version", "prompt_length"):
            if not _whole(getattr(self, name)):
                raise bad(name, f"{name} must be a whole number, got {getattr(self, name)!r}")
        if self.run_id < 1:
            raise bad("run_id", "run_id is required")
        for name in ("task_id", "parent_id"):
            value = getattr(self, name)
            if value is not None and not _whole(value):
                raise bad(name, f"{name} must be an id or null, got {value!r}")
        for name, limit in (("key", KEY_MAX), ("group_id", GROUP_MAX)):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise bad(name, f"{name} is required")
            if len(value) > limit:
                raise bad(name, f"{name} is longer than {limit} characters")
        for name in ("prompt_text", "response_text"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise bad(name, f"{name} must be text")
            if "\x00" in value:
                setattr(self, name, value.replace("\x00", "\ufffd"))
        if self.messages is not None:
            if not isinstance(self.messages, list):
                raise bad("messages", "messages must be a list of chat messages")
            self.messages = without_nul(self.messages)
        if not isinstance(self.metadata, dict):
            raise bad("metadata", "metadata must be a mapping")
        self.metadata = without_nul(self.metadata)

        tokens = self.token_ids
        if not isinstance(tokens, list) or not all(_whole(t) for t in tokens):
            raise bad("token_ids", "token_ids must be a list of integers")
        if self.prompt_length < 0 or (tokens and self.prompt_length > len(tokens)):
            raise bad("prompt_length", f"prompt_length {self.prompt_length} does not fit {len(tokens)} token ids")
        response = len(tokens) - self.prompt_length if tokens else 0
        for name in ("logprobs", "action_mask"):
            seq = getattr(self, name)
            if seq is None:
                continue
            if not isinstance(seq, list):
                raise bad(name, f"{name} must be a list")
            if len(seq) != response:
                raise bad(name, f"{name} has {len(seq)} entries for {response} response tokens "
                                f"(token_ids minus prompt_length)")
        if self.logprobs is not None and not all(_finite(x) for x in self.logprobs):
            raise bad("logprobs", "logprobs must be finite numbers")
        if self.action_mask is not None and not all(x in (0, 1) and not isinstance(x, float) for x in self.action_mask):
            raise bad("action_mask", "action_mask holds 1 (the model acted) or 0 (the environment) per token")

        for name in ("reward", "auto_reward", "human_reward"):
            value = getattr(self, name)
            if value is not None and not _finite(value):
                raise bad(name, f"{name} must be a finite number, got {value!r}")
        if self.priority is not None and not _finite(self.priority):
            raise bad("priority", f"priority must be a finite number, got {self.priority!r}")
        parts = self.reward_parts
        if not isinstance(parts, dict) or not all(isinstance(k, str) and _finite(v) for k, v in parts.items()):
            raise bad("reward_parts", "reward_parts must map names to finite numbers")

        if self.status not in STATUSES:
            raise bad("status", f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.status not in WRITABLE_STATUSES:
            raise bad("status", f"a new experience cannot be written as {self.status}")
        if self.source not in SOURCES:
            raise bad("source", f"source {self.source!r} is not one of {', '.join(SOURCES)}")
        if not isinstance(self.is_expert, bool):
            raise bad("is_expert", "is_expert must be true or false")
        for name, limit in (("finish_reason", FINISH_MAX), ("filter_reason", FILTER_MAX)):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > limit:
                raise bad(name, f"{name} is text of at most {limit} characters")

    # ---- constructors ----------------------------------------------------------------

    @classmethod
    def scored(cls, *, cfg: RunConfig, auto_reward: float | None, **values: Any) -> ExperienceDraft:
        """A fresh experience whose status and rewards follow the run's feedback settings:
        under `auto` ready with its automatic reward, under `blend`/`human` pending for
        people. Without an automatic reward yet (remote scorers or the environment will
        give it) it is pending, with no reward."""
        if auto_reward is None:
            initial: InitialFields = {"status": "pending", "auto_reward": None, "reward": None}
        else:
            initial = experience_initial_fields(cfg=cfg, auto_reward=auto_reward)
        return cls(**values, **initial)

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> ExperienceDraft:
        """A draft from a plain row (what a pipeline operator hands back); unknown fields
        are refused by name."""
        values: dict[str, Any] = {}
        for name, value in row.items():
            name = _ALIASES.get(name, name)
            if name not in _NAMES:
                raise InvalidInput(f"unknown field {name!r}", field=name)
            values[name] = getattr(value, "pk", value) if name in ("run_id", "task_id", "parent_id") else value
        for name in ("run_id", "key", "group_id"):
            if values.get(name) in (None, ""):
                raise InvalidInput(f"{name} is required", field=name)
        return cls(**values)

    # ---- what it becomes -------------------------------------------------------------

    def event_payload(self, *, id: int) -> Body:
        """The one payload of `experience.created` (the annotation page, the dashboard and
        environments' event streams read this shape)."""
        return {
            "id": id,
            "group_id": self.group_id,
            "task_id": self.task_id,
            "source": self.source,
            "status": self.status,
            "reward": self.reward,
            "reward_parts": self.reward_parts,
            "model_version": self.model_version,
            "finish_reason": self.finish_reason,
            "prompt": self.prompt_text,
            "response": self.response_text,
        }

    def columns(self) -> dict[str, object]:
        """The values stored: the draft's fields, with the column defaults filled in."""
        values = {name: getattr(self, name) for name in _ORDER}
        if values["priority"] is None:
            values["priority"] = 0.0
        return values

    # ---- a read-only row view (Mapping) ----------------------------------------------

    def __getitem__(self, name: str) -> object:
        if name not in _NAMES:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(_ORDER)

    def __len__(self) -> int:
        return len(_ORDER)


_ORDER: tuple[str, ...] = tuple(f.name for f in fields(ExperienceDraft))
_NAMES = frozenset(_ORDER)


def drafts_from_rows(rows: Iterable[Mapping[str, object]], *, where: str = "") -> list[ExperienceDraft]:
    """Drafts from plain rows, all or none; an error names the row's position (and `where`)."""
    out: list[ExperienceDraft] = []
    for i, row in enumerate(rows):
        try:
            out.append(row if isinstance(row, ExperienceDraft) else ExperienceDraft.from_row(row))
        except InvalidInput as exc:
            raise exc.within(f"{where}{i}") from None
    return out
