"""Request and response schemas of the environment API (pydantic, via django-ninja).

Inputs forbid unknown keys so a typo is a 422 naming the field, not a silently ignored
value. Integer bounds follow the database columns so no value can overflow one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Path, Schema
from pydantic import (
    ConfigDict,
    Field,
    FiniteFloat,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from apps.feedback.kinds import KindApiIn, kind_get, kind_names, kinds
from apps.runs.api_kit import Error
from kernel.config import RunConfig

Id = Annotated[int, Field(ge=1, le=2**63 - 1)]
Int32 = Annotated[int, Field(ge=0, le=2**31 - 1)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
Name = Annotated[str, Field(min_length=1, max_length=100)]
LongText = Annotated[str, Field(max_length=200_000)]


class In(Schema):
    # strict: JSON's true/false are never taken for 1/0 (`"reward": true`), nor text for
    # numbers; an int is still a valid float.
    model_config = ConfigDict(extra="forbid", strict=True)


# ---- runs ----------------------------------------------------------------------------


class ModelVersionOut(Schema):
    number: int
    checkpoint: str = Field(description="directory on shared storage, or hub id, the explorers load")
    train_step: int
    created_at: datetime | None = None


class TasksetOut(Schema):
    id: int
    name: str
    import_status: Literal["queued", "importing", "ready", "failed"] = Field(
        description="queued or importing while a large upload is imported in the background; failed keeps no task")
    rows_imported: int = Field(description="source records read so far")
    rows_total: int | None = Field(description="source records in all; null while not yet counted")
    error: str = Field(description="why the import failed, naming the line; empty otherwise")
    tasks: int = Field(description="tasks stored (0 until the import is done)")


class RunOut(Schema):
    id: int
    name: str
    status: str
    config: RunConfig
    taskset_id: int | None
    current_version: ModelVersionOut
    explore_step: int
    train_step: int
    created_at: datetime
    takes_feedback: bool = Field(description="false once the run is finished or failed: feedback is refused (409)")


# ---- tasks ---------------------------------------------------------------------------


class PlainMessage(In):
    role: Literal["system", "user", "assistant"]
    content: Annotated[str, Field(max_length=200_000)]


class TaskIn(In):
    prompt: LongText | None = None
    messages: Annotated[list[PlainMessage], Field(min_length=1, max_length=500)] | None = None
    reference: object = Field(None, description="the reference answer (any JSON)")
    tests: object = None
    domain: Annotated[str, Field(min_length=1, max_length=50)] = "general"
    metadata: dict[str, object] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_prompt(self) -> TaskIn:
        if not self.prompt and not self.messages:
            raise ValueError("give a prompt or messages")
        return self


class TasksAddIn(In):
    tasks: Annotated[list[TaskIn], Field(min_length=1, max_length=1000)]


class TasksAddOut(Schema):
    taskset_id: int
    task_ids: list[int]


class TaskClaimIn(In):
    size: Annotated[int, Field(ge=1, le=256)] = 1
    lease_seconds: Annotated[float, Field(ge=1, le=86400)] | None = Field(None, description="default: the server's lease")
    worker: Annotated[str, Field(max_length=100)] = Field("", description="a label for this environment process")


class TaskOut(Schema):
    attempt_id: int
    task_id: int
    epoch: int
    prompt: str
    messages: list[dict[str, object]] | None
    reference: object = None
    domain: str
    metadata: dict[str, object]


class TaskClaimOut(Schema):
    worker: str = Field(description="the lease owner; pass the same label to release or finish")
    lease_expires_at: datetime | None
    tasks: list[TaskOut]


class TaskReleaseIn(In):
    attempt_ids: Annotated[list[Id], Field(max_length=1000)] | None = Field(None, description="all of this worker's when omitted")
    worker: Annotated[str, Field(max_length=100)] = ""


class TaskFinishIn(In):
    attempt_ids: Annotated[list[Id], Field(min_length=1, max_length=1000)]
    model_version: Int32 | None = Field(None, description="default: the run's current version")
    worker: Annotated[str, Field(max_length=100)] = ""


class CountOut(Schema):
    count: int


class BulkIn(Schema):
    """A bulk action over experiences of the run (apps/feedback/bulk.py): exclude, include,
    flag or export, as the key's person (their role on the run decides)."""

    action: str
    ids: list[int] = Field(..., description="experience ids of this run, at least one")
    reason: str = Field("", max_length=500, description="flag: why")


class BulkOut(Schema):
    action: str
    count: int
    skipped: int
    why_skipped: str


# ---- chat messages -------------------------------------------------------------------


class ToolFunction(In):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    arguments: Annotated[str, Field(max_length=100_000)] = Field("", description="JSON text, as the model wrote it")


class ToolCall(In):
    id: Annotated[str, Field(max_length=200)] = ""
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatMessage(In):
    role: Literal["system", "user", "assistant", "tool"]
    content: LongText | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=64)] | None = None
    tool_call_id: Annotated[str, Field(max_length=200)] | None = None
    name: Annotated[str, Field(max_length=200)] | None = None

    @model_validator(mode="after")
    def _shape(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.content is None and not self.tool_calls:
            raise ValueError("a message needs content or tool_calls")
        return self


# ---- trajectories --------------------------------------------------------------------


class TrajectoryIn(In):
    key: Annotated[str, Field(min_length=1, max_length=200)] = Field(description="client idempotency key, unique in the run")
    group_id: Annotated[str, Field(min_length=1, max_length=100)] | None = Field(None, description="default: the key")
    task_id: Id | None = None
    prompt: LongText | None = None
    response: LongText | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=500)] | None = None
    token_ids: Annotated[list[TokenId], Field(max_length=262_144)] | None = Field(None, description="prompt then response tokens")
    prompt_length: Int32 | None = None
    logprobs: Annotated[list[FiniteFloat], Field(max_length=262_144)] | None = Field(None, description="one per response token")
    action_mask: Annotated[list[Literal[0, 1]], Field(max_length=262_144)] | None = Field(
        None, description="one per response token: 1 where the model acted, 0 for environment tokens"
    )
    reward: FiniteFloat | None = Field(None, description="omit to send it later as env_reward feedback")
    reward_parts: Annotated[dict[Name, FiniteFloat], Field(max_length=64)] = Field(default_factory=dict)
    model_version: Int32 | None = Field(None, description="default: the run's current version")
    finish_reason: Annotated[str, Field(max_length=20)] = ""
    metadata: dict[str, object] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> TrajectoryIn:
        if not self.messages and self.prompt is None and self.response is None:
            raise ValueError("give messages, or a prompt and a response")
        if self.token_ids is None:
            if self.logprobs is not None or self.action_mask is not None or self.prompt_length is not None:
                raise ValueError("logprobs, action_mask and prompt_length need token_ids")
            return self
        if self.prompt_length is None:
            raise ValueError("token_ids need prompt_length (how many of them are the prompt)")
        if self.prompt_length > len(self.token_ids):
            raise ValueError(f"prompt_length {self.prompt_length} is longer than the {len(self.token_ids)} token_ids")
        response = len(self.token_ids) - self.prompt_length
        for name in ("logprobs", "action_mask"):
            seq = getattr(self, name)
            if seq is not None and len(seq) != response:
                raise ValueError(f"{name} has {len(seq)} entries for {response} response tokens")
        return self


class TrajectoriesIn(In):
    trajectories: Annotated[list[TrajectoryIn], Field(min_length=1, max_length=256)]


class TrajectoryResult(Schema):
    key: str
    id: int = Field(description="the experience id")
    duplicate: bool = Field(description="the key was already stored; nothing was changed")


class TrajectoriesOut(Schema):
    created: int
    duplicates: int
    results: list[TrajectoryResult]


# ---- feedback ------------------------------------------------------------------------


class FeedbackIn:
    """The feedback route's body: one of the registered kinds' bodies (apps.feedback.kinds:
    each kind's `ApiIn`), chosen by `kind`, as the registry stands when a body comes in or
    the schema is asked for (a kind registered later is taken and described). Validated, it is
    the kind's model.

    The API took one flat body for every kind before; for its clients a field of another kind
    sent empty (null, "", [], {}) is still passed over, and one sent with a value is refused
    naming the kinds it is for."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(_feedback_body)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        bodies = [(k.name, k.ApiIn) for k in kinds() if k.ApiIn is not None]
        return {"title": "FeedbackIn", "description": "One piece of feedback, by `kind`; each kind stores the same "
                                                      "value as the annotation page's.",
                "oneOf": [handler(model.__pydantic_core_schema__) for _, model in bodies],
                "discriminator": {"propertyName": "kind"}}


class _KindOf(In):
    kind: str = Field(description="the kind of feedback")

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        names = kind_names(api=True)
        if kind not in names:
            raise ValueError(f"kind is one of {', '.join(names)}")
        return kind


def _empty(value: object) -> bool:
    return value is None or value in ("", [], {})


def _feedback_body(data: object) -> KindApiIn:
    if not isinstance(data, dict):
        raise ValueError("feedback is a JSON object")
    kind = kind_get(_KindOf.model_validate({"kind": data.get("kind")}).kind)
    assert kind.ApiIn is not None  # _KindOf takes only the kinds posted through the API
    own = kind.ApiIn.model_fields
    others: dict[str, list[str]] = {}
    for other in kinds():
        if other.ApiIn is not None and other is not kind:
            for name in other.ApiIn.model_fields:
                if name not in own:
                    others.setdefault(name, []).append(other.name)
    for name in [n for n in data if n not in own and n in others]:
        if not _empty(data[name]):
            raise ValueError(f"{name} is for {' and '.join(others[name])} feedback only")
    return kind.ApiIn.model_validate({k: v for k, v in data.items() if k in own or k not in others})


class LabelStateOut(Schema):
    """Where one label stands (apps/feedback/ledger.py): exactly one state."""

    state: Literal["trained", "reward_model", "pending", "unused"]
    reason: str = Field(description="why unused (rejected; heldout, lone, gold, untrusted, no_pair: why it made no "
                                     "preference pair; algorithm, late, filtered, run_ended) or pending "
                                     "(waiting, queued, training); empty otherwise")
    step: int | None = Field(description="the train step that trained it (trained)")
    version: int | None = Field(description="the policy version it is in (trained), or the first reward-model "
                                            "version whose training pairs came from it (reward_model)")
    text: str = Field(description="the state in words, as the pages say it")


class LedgerStateCountOut(Schema):
    state: str = Field(description="trained, reward_model, pending or unused")
    words: str = Field(description="the words the pages put after its count")
    count: int


class LedgerCountsOut(Schema):
    total: int = Field(description="labels counted: the sum of the states' counts")
    trained: int
    reward_model: int = Field(description="taught the reward model (a version trained on a pair made from it), "
                                          "not trained by the policy")
    pending: int
    unused: int
    unused_by: dict[str, int] = Field(description="unused labels by why: rejected, heldout, lone, gold, untrusted, "
                                                  "no_pair, algorithm, late, filtered, run_ended")
    pending_by: dict[str, int] = Field(description="pending labels by where: waiting, queued, training, "
                                                   "reward_model_next (the reward model's next version reads it)")
    states: list[LedgerStateCountOut] = Field(description="every state with its count, in the order and words every "
                                                          "page, the summary and `rft figures` show them")


class RunLedgerOut(Schema):
    """The run's labels by state: in all, and per person (the per-person counts add up to it)."""

    run: LedgerCountsOut
    people: dict[str, LedgerCountsOut]


class EvalSeriesOut(Schema):
    name: str
    label: str = Field(description="what it measures, in words")
    start: float
    end: float
    best: float
    best_step: int
    points: int
    start_step: int
    end_step: int
    start_tasks: int | None = Field(description="the held-out tasks the first evaluation counted")
    end_tasks: int | None = Field(description="the held-out tasks the last evaluation counted")
    start_interval: list[float] | None = Field(
        description="a share's 95% interval [low, high] over start_tasks (null for a reward or length)")
    end_interval: list[float] | None = Field(description="a share's 95% interval [low, high] over end_tasks")
    change_interval: list[float] | None = Field(description="a share's change (end - start) 95% interval")
    change_words: str = Field(description='"rose", "fell" or "no clear change" (the change interval holds 0); "" without one')


class EvaluationOut(Schema):
    """The run's held-out evaluation: each series it recorded (start, end, best, with the tasks
    counted and a share's interval), what the figures count (tasks, samples per task, greedy
    or sampled) and the best version with the metric that chose it (eval.best_by)."""

    series: list[EvalSeriesOut]
    tasks: int | None = Field(description="the held-out tasks the newest evaluation counted")
    samples: int = Field(description="answers per task (eval.n)")
    greedy: bool = Field(description="greedy decoding (temperature 0), else sampled")
    temperature: float
    basis: str | None = Field(description='what the figures count, in words, e.g. "64 tasks × 2 samples, sampled at temperature 1"')
    best_version: int | None
    best_by: str | None = Field(description="the metric that chose the best version, e.g. eval/accuracy")
    best_by_label: str | None
    best_value: float | None


class FeedbackOut(Schema):
    id: int
    kind: str
    experience_id: int | None = Field(description="null for a ranking")
    group_id: str
    late: bool = Field(description="arrived after the experience was trained on: its reward is unchanged, and a "
                                   "label still teaches the run's reward model (see effect)")
    effect: str = Field(description="what this feedback does, in words: e.g. \"moves its group's reward\", "
                                    "\"late: teaches the reward model\"")
    value: dict[str, object] = Field(description="as stored: the same shape whichever door it came through")
    experience_status: str | None = Field(description="the experience's status after this feedback")
    experience_reward: float | None
    state: LabelStateOut | None = Field(None, description="where the label stands now (null for feedback that "
                                                          "is not a label: a flag, an environment reward)")


class AnnotationOut(Schema):
    """What waits on the run's annotation page for the key's person (who created the key)."""

    annotator: str = Field(description="the key's person: the account that created the key")
    waiting: int = Field(description="what waits for them: their queue plus what it may still hand them, the "
                                     "number every page shows")
    ratings: int = Field(description="ratings on the run, every annotator's")
    late: int = Field(description="labels that arrived after their group trained (they teach the reward model)")


# ---- rollouts ------------------------------------------------------------------------


class RolloutRequestIn(In):
    prompt: Annotated[str, Field(max_length=100_000)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=500)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    max_tokens: Annotated[int, Field(ge=1, le=4096)] | None = Field(None, description="default: the run's sampling")
    temperature: Annotated[float, Field(ge=0, le=5)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=100_000)] | None = None
    stop: Annotated[list[Annotated[str, Field(min_length=1, max_length=200)]], Field(max_length=8)] | None = None
    seed: Int32 | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> RolloutRequestIn:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class RolloutsIn(In):
    requests: Annotated[list[RolloutRequestIn], Field(min_length=1, max_length=64)]
    timeout_seconds: Annotated[float, Field(gt=0, le=600)] = Field(60.0, description="capped by the server")


class CompletionOut(Schema):
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class RolloutOut(Schema):
    prompt_token_ids: list[int]
    model_version: int
    completions: list[CompletionOut]


class RolloutsOut(Schema):
    results: list[RolloutOut]
