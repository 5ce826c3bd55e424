"""The run config: one schema that validates configs everywhere (form, API, file).

Errors name the bad field by its dotted path (`sampling.temperature`), so a form can show
them beside the field and the CLI can print them as they are.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from apps.hygiene import MAX_INT, InputRejected, config_text_parse, tree_check
from rftweb.exceptions import InvalidInput


class Algorithm(StrEnum):
    GRPO = "grpo"
    DPO = "dpo"
    SFT = "sft"
    MIX = "mix"


class Mode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"
    EXPLORE = "explore"
    TRAIN = "train"


class _Strict(BaseModel):
    # No NaN or infinity (jsonb cannot hold them; `1e400` parses as infinity).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: Any) -> Any:
        # Lax mode would take `true` for 1 in a number field.
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            annotation = cls.model_fields[info.field_name].annotation
            if annotation in (int, float, int | None, float | None):
                raise ValueError("expected a number, not true/false")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, value: Any, info: Any) -> Any:
        # Seeds, counts and steps end up in 64-bit columns and libraries.
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise ValueError("number is too large (at most 2^63 - 1)")
        return value


class SamplingConfig(_Strict):
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    max_tokens: int = Field(64, ge=1, le=65536)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None


class RewardTerm(_Strict):
    name: str = Field(min_length=1)
    weight: float = 1.0
    params: dict[str, Any] = Field(default_factory=dict)
    # Apply only to tasks of these domains; empty means every domain.
    domains: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _known_reward(cls, name: str) -> str:
        from apps.rewards.registry import reward_names

        known = reward_names()
        if name not in known:
            raise ValueError(f"unknown reward {name!r}; known: {', '.join(sorted(known))}")
        return name

    @model_validator(mode="after")
    def _params_fit(self) -> "RewardTerm":
        # Each reward checks its own params (a regex that compiles, a model path), so a bad
        # term fails run validation instead of every explore step.
        from apps.rewards.registry import reward_params_check

        reward_params_check(name=self.name, params=self.params)
        return self


class FeedbackPolicy(_Strict):
    mode: Literal["auto", "blend", "human"] = "auto"
    w_auto: float = Field(0.5, ge=0.0)
    w_human: float = Field(0.5, ge=0.0)
    # How long a group waits for human rewards before the fallback applies.
    wait_seconds: float = Field(600.0, ge=0.0)
    fallback: Literal["auto", "drop"] = "auto"
    # How many annotators see each item.
    overlap: int = Field(1, ge=1, le=10)
    rank_rule: Literal["borda"] = "borda"
    # What raters see: guidelines (Markdown, rendered sanitised beside the items), whether
    # the automatic reward is shown (it biases people, so not by default), a daily target.
    guidelines: str = Field("", max_length=20000, json_schema_extra={"widget": "markdown"},
                            description="Markdown shown to raters beside the items")
    show_auto_reward: bool = Field(False, description="show raters the automatic reward (it biases them)")
    daily_target: int = Field(0, ge=0, description="items per rater per day shown as a target; 0: none")

    @model_validator(mode="after")
    def _weights(self) -> "FeedbackPolicy":
        if self.mode == "blend" and self.w_auto + self.w_human <= 0:
            raise ValueError("blend needs w_auto + w_human > 0")
        return self


class ReplayConfig(_Strict):
    # 1 means every experience is trained on once.
    max_uses: int = Field(1, ge=1)
    cooldown_seconds: float = Field(0.0, ge=0.0)
    priority_decay: float = Field(1.0, gt=0.0, le=1.0)


class AlgorithmConfig(_Strict):
    learning_rate: float = Field(1e-5, gt=0.0)
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = "dapo"
    beta: float = Field(0.0, ge=0.0)
    epsilon: float = Field(0.2, gt=0.0)
    epsilon_high: float | None = None
    max_grad_norm: float = Field(1.0, gt=0.0)
    # MIX: (1 - mu) * GRPO(usual) + mu * SFT(expert); expert_share of each batch is expert.
    mu: float = Field(0.1, ge=0.0, le=1.0)
    expert_share: float = Field(0.25, ge=0.0, le=1.0)
    # DPO
    dpo_beta: float = Field(0.1, gt=0.0)
    scale_rewards: Literal["group", "batch", "none"] = "group"


class PipelineStep(_Strict):
    name: str = Field(min_length=1)
    # Validated even when left out: some operators have required params.
    params: dict[str, Any] = Field(default_factory=dict, validate_default=True)

    @field_validator("name")
    @classmethod
    def _known_operator(cls, name: str) -> str:
        from apps.buffer.pipeline.registry import operator_names

        known = operator_names()
        if name not in known:
            raise ValueError(f"unknown pipeline operator {name!r}; known: {', '.join(sorted(known))}")
        return name

    @field_validator("params")
    @classmethod
    def _params_fit(cls, params: dict[str, Any], info: Any) -> dict[str, Any]:
        from apps.buffer.pipeline.registry import params_check

        name = info.data.get("name")
        if name is not None:  # an unknown name was already reported
            params_check(name, params)
        return params


class PipelineConfig(_Strict):
    """Data-pipeline operators per stage, applied in the order listed."""

    on_write: list[PipelineStep] = Field(default_factory=list)
    on_import: list[PipelineStep] = Field(default_factory=list)
    on_claim: list[PipelineStep] = Field(default_factory=list)

    @field_validator("on_write", "on_import", "on_claim")
    @classmethod
    def _runs_at_stage(cls, steps: list[PipelineStep], info: Any) -> list[PipelineStep]:
        from apps.buffer.pipeline.registry import stage_check

        stage = info.field_name.removeprefix("on_")
        for i, step in enumerate(steps):
            try:
                stage_check(step.name, stage)
            except ValueError as exc:
                raise ValueError(f"step {i}: {exc}") from None
        return steps


class RunConfig(_Strict):
    model: str = Field(min_length=1, description="hub id or local path of the starting model")
    tokenizer: str | None = None
    algorithm: Algorithm = Algorithm.GRPO
    mode: Mode = Mode.SYNC
    engine: Literal["vllm", "transformers"] = "transformers"
    sync_interval: int = Field(1, ge=1)
    sync_offset: int = Field(0, ge=0)
    max_staleness: int = Field(0, ge=0)
    repeat_times: int = Field(4, ge=1, le=256)
    explore_batch_size: int = Field(8, ge=1, description="tasks per explore step")
    train_batch_size: int = Field(32, ge=1, description="experiences per trainer step")
    total_steps: int = Field(100, ge=1)
    epochs: int = Field(1, ge=1)
    eval_every: int = Field(0, ge=0)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rewards: list[RewardTerm] = Field(default_factory=list)
    feedback: FeedbackPolicy = Field(default_factory=FeedbackPolicy)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    trainer: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        if self.algorithm in (Algorithm.GRPO, Algorithm.MIX) and self.repeat_times < 2:
            raise ValueError("repeat_times must be at least 2 for grpo and mix (advantages are group-relative)")
        return self


class ConfigInvalid(InvalidInput):
    """A run config failed validation; `errors` maps dotted field paths to messages."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(errors=errors)


def _errors_by_field(exc: ValidationError) -> dict[str, str]:
    errors: dict[str, str] = {}
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key {str(err['loc'][-1])!r}"
        errors.setdefault(field, msg)
    return errors


def config_validate(*, data: Any) -> RunConfig:
    """Validate a config mapping; raise ConfigInvalid naming each bad field. Values
    Postgres cannot store (NUL, lone surrogates, NaN, too deep) are refused first
    (`apps.hygiene.tree_check`), so whatever validates can be written."""
    if isinstance(data, RunConfig):
        return data
    if not isinstance(data, dict):
        raise ConfigInvalid({"": "a run config must be a mapping of keys to values"})
    try:
        tree_check(data, root="")
    except InputRejected as exc:
        raise ConfigInvalid({exc.field: exc.message}) from None
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigInvalid(_errors_by_field(exc)) from None


def config_file_read(*, data: bytes | str, filename: str = "config") -> Any:
    """A YAML or JSON config file's mapping, unvalidated (to show an invalid file in the
    form). Bytes are decoded strictly as UTF-8; ConfigInvalid names the line."""
    try:
        return config_text_parse(data, filename=filename)
    except InputRejected as exc:
        raise ConfigInvalid({exc.field: exc.message}) from None


def config_parse(*, text: bytes | str, filename: str = "config") -> RunConfig:
    """Parse a YAML or JSON config file (bytes: strictly UTF-8) and validate it."""
    return config_validate(data=config_file_read(data=text, filename=filename))


def config_dump(config: RunConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")
