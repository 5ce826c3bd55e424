"""Request shapes of the OpenAI-compatible endpoint (`apps/envapi/openai_api.py`).

Fields OpenAI defines and this platform serves are validated here; fields it defines and we
cannot honour (penalties, logit_bias, other response formats…) are refused with a 400 that
names them rather than silently ignored; fields OpenAI does not define are ignored, as agent
frameworks send extras of their own.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_N = 16
MAX_TOKENS = 32_768
Text = Annotated[str, Field(max_length=1_000_000)]


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCallIn(_In):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    arguments: Annotated[str, Field(max_length=200_000)] = ""


class ToolCallIn(_In):
    id: Annotated[str, Field(max_length=200)] = ""
    type: Literal["function"] = "function"
    function: FunctionCallIn


class TextPart(_In):
    type: Literal["text"]
    text: Text


class MessageIn(_In):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[TextPart], Field(max_length=256)] | None = None
    name: Annotated[str, Field(max_length=200)] | None = None
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=64)] | None = None
    tool_call_id: Annotated[str, Field(max_length=200)] | None = None

    @model_validator(mode="after")
    def _shape(self) -> MessageIn:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.content is None and not self.tool_calls:
            raise ValueError("a message needs content (or, for the assistant, tool_calls)")
        return self

    def for_template(self) -> dict[str, object]:
        data: dict[str, object] = {"role": "system" if self.role == "developer" else self.role}
        if isinstance(self.content, list):
            data["content"] = "".join(p.text for p in self.content)
        else:
            data["content"] = self.content
        if self.tool_calls:
            data["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        return data


class FunctionDef(_In):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: Annotated[str, Field(max_length=10_000)] | None = None
    parameters: dict[str, object] | None = None
    strict: bool | None = None


class ToolIn(_In):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(_In):
    type: Literal["function"]
    function: dict[str, str]


class StreamOptions(_In):
    include_usage: bool = False


class _SamplingIn(_In):
    model: Annotated[str, Field(min_length=1, max_length=200)]
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    stop: Annotated[str, Field(max_length=200)] | Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=4)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=200)] | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extension: the answer carries the prompt's and each choice's token ids.
    return_token_ids: bool = False

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("penalties are not supported by this endpoint; omit it or send 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported by this endpoint")
        return value

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionIn(_SamplingIn):
    messages: Annotated[list[MessageIn], Field(min_length=1, max_length=1000)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[ToolIn], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, object] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionIn:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.response_format and self.response_format.get("type") != "text":
            raise ValueError("only response_format {\"type\": \"text\"} is supported")
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            raise ValueError("tool_choice needs tools")
        if self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice):
            # Forcing a call needs guided decoding, which the rollout engines do not run.
            raise ValueError("tool_choice 'required' or a named function is not supported; use 'auto' or 'none'")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionIn(_SamplingIn):
    prompt: (
        Annotated[str, Field(max_length=1_000_000)]
        | Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(min_length=1, max_length=262_144)]
        | Annotated[list[Annotated[str, Field(max_length=1_000_000)]], Field(min_length=1, max_length=64)]
    )
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _supported(self) -> CompletionIn:
        if self.echo:
            raise ValueError("echo is not supported by this endpoint")
        if self.suffix:
            raise ValueError("suffix is not supported by this endpoint")
        if self.best_of not in (None, 1) and self.best_of != self.n:
            raise ValueError("best_of is not supported by this endpoint")
        return self

    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], int):
            return [list(self.prompt)]
        return list(self.prompt)  # type: ignore[arg-type]
