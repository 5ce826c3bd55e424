"""OpenAI-style generation on a rollout worker: chat messages (with tools) or a raw prompt in,
exact token ids, logprobs and parsed tool calls out.

The web side (`apps/envapi/openai_api.py`) validates the request and sends it here as one
`workers.explore.chat.chat` task on the `rollout` queue; everything that needs the tokenizer
happens here: the chat template (tools included), incremental detokenisation for streaming
(both engines hand over each step's tokens: `generate(on_tokens=…)`),
the tool-call parser. The answer is plain JSON and always carries the exact prompt and
completion token ids and the version that sampled them, so a session can be assembled into
a training trajectory without re-tokenising anything.

Tool calls are parsed with vLLM's Hermes parser (`<tool_call>{json}</tool_call>`, what
Qwen2-family templates and our demo template use) where vLLM is importable, and with the
same rule here where it is not (the transformers engine on a host without vLLM).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from apps.runs.ports import RunView, run_current_version, run_view
from kernel.exceptions import InvalidInput
from apps.envapi.ports import reply_push, StreamWriter
from kernel.jsontypes import JSONObject
from rftweb.taskkit import celery_task
from workers.engines import engine_cached, engine_for, SamplingSpec
from workers.explore.explorer import checkpoint_known, engine_at, VersionNotReady, worker_name

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from workers.engines.base import Sample, SamplingSpec

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "logprobs")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class ToolCallFunction(TypedDict):
    name: str
    # The arguments as a JSON string (OpenAI's form).
    arguments: str


class ToolCall(TypedDict):
    """One OpenAI `tool_calls` entry."""

    id: str
    type: str
    function: ToolCallFunction


class ChatChoice(TypedDict):
    """One sampled completion of a prompt, with everything an OpenAI answer is built from."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    # Each token's share of the text (streaming's pieces), and each token decoded alone.
    pieces: list[str]
    tokens: list[str]
    # Per token, the likeliest alternatives as [token text, logprob].
    top_logprobs: NotRequired[list[list[list[str | float]]]]
    content: NotRequired[str | None]
    tool_calls: NotRequired[list[ToolCall]]


class ChatPrompt(TypedDict):
    prompt_token_ids: list[int]
    choices: list[ChatChoice]


class ChatError(TypedDict):
    message: str
    param: str | None
    status: int
    code: str | None


class ChatAnswer(TypedDict, total=False):
    """What the worker answers a request: the version and each prompt's choices, or the
    error the endpoint answers with."""

    model_version: int
    prompts: list[ChatPrompt]
    error: ChatError


class ChatRequestInvalid(InvalidInput, ValueError):
    """A request the worker cannot serve; `param` names the field, `status` the HTTP code."""

    code = "chat_request_invalid"

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.openai_code = code  # OpenAI's vocabulary (apps/envapi/openai_services.py)


def messages_for_template(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as chat templates expect them: a tool call's arguments as an object
    (OpenAI sends a JSON string; HF templates and vLLM render the parsed object)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        msg = dict(m)
        content = msg.get("content")
        if isinstance(content, list):
            # Content parts: text only (this platform's models read text).
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") != "text":
                    raise ChatRequestInvalid(f"messages.{i}.content.{j}: only text parts are supported",
                                             param=f"messages.{i}.content")
                texts.append(str(part.get("text", "")))
            msg["content"] = "".join(texts)
        calls = []
        for call in msg.get("tool_calls") or []:
            function = dict(call.get("function") or {})
            args = function.get("arguments")
            if isinstance(args, str):
                try:
                    function["arguments"] = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    raise ChatRequestInvalid(f"messages.{i}.tool_calls: arguments are not valid JSON",
                                             param=f"messages.{i}.tool_calls") from None
            calls.append({**call, "function": function})
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, *, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[object] | None) -> list[int]:
    """The prompt's token ids through the model's chat template, tools included, with the
    assistant turn opened."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatRequestInvalid("this model has no chat template; use /v1/completions", param="messages")
    rendered = tokenizer.apply_chat_template(
        messages_for_template(messages), tools=list(tools) if tools else None, add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def tool_calls_parse(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content before the first call, calls as OpenAI `tool_calls`) from a completion's text."""
    if "<tool_call>" not in text:
        return text, []
    calls: list[tuple[str, str]] = []
    content: str | None = text
    parsed = False
    try:
        from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

        info = Hermes2ProToolParser(tokenizer).extract_tool_calls(text, request=None)
        if info.tools_called:
            calls = [(c.function.name, c.function.arguments) for c in info.tool_calls]
            content = info.content
        parsed = True
    except ImportError:
        pass
    if not parsed:
        try:
            raw = [json.loads(a or b) for a, b in _TOOL_CALL.findall(text)]
            calls = [(str(r["name"]), json.dumps(r.get("arguments", {}), ensure_ascii=False)) for r in raw]
            content = text[: text.find("<tool_call>")] or None
        except (ValueError, KeyError, TypeError):
            calls = []  # not a well-formed call: the text is the answer
    return content, [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": n, "arguments": a}}
        for n, a in calls
    ]


def _decodes_plainly(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's `decode` is only its tokenizers-library (Rust) decode: a fast
    tokenizer whose class changes neither `decode` nor `_decode` and cleans up no spaces."""
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers than the one pinned: its own decode
        return False
    tokenizer_class = type(tokenizer)
    return (isinstance(tokenizer, TokenizersBackend) and tokenizer_class.decode is PreTrainedTokenizerBase.decode
            and tokenizer_class._decode is TokenizersBackend._decode and not tokenizer.clean_up_tokenization_spaces)


def decode_each(tokenizer: PreTrainedTokenizerBase, seqs: Sequence[Sequence[int]], *, skip_special_tokens: bool) -> list[str]:
    """`tokenizer.decode(seq, skip_special_tokens=…)` of each sequence, in one call into the
    tokenizers library where that is all `decode` does. An answer decodes each token alone and
    each prefix of its completion (`token_pieces`): per call, `decode` spent more CPU in Python
    (converting the ids, checking each is a number) than decoding, on the rollout worker that
    serves OpenAI calls one after another (bench/openai_endpoint)."""
    if not seqs:
        return []
    if _decodes_plainly(tokenizer):
        return list(tokenizer.backend_tokenizer.decode_batch([[int(t) for t in s] for s in seqs],
                                                             skip_special_tokens=skip_special_tokens))
    return [tokenizer.decode([int(t) for t in s], skip_special_tokens=skip_special_tokens) for s in seqs]


def token_pieces(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]) -> list[str]:
    """Each token's share of the decoded text (incremental detokenisation, as streaming sends
    it): the pieces join to the whole decode, a multi-byte character lands on its last token."""
    ids = list(token_ids)
    pieces: list[str] = []
    previous = ""
    for text in decode_each(tokenizer, [ids[: i + 1] for i in range(len(ids))], skip_special_tokens=True):
        if text.endswith("\ufffd"):
            pieces.append("")
            continue
        pieces.append(text[len(previous):])
        previous = text
    return pieces


def token_texts(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded alone, special tokens included (logprobs' `token`s)."""
    return decode_each(tokenizer, [[t] for t in token_ids], skip_special_tokens=False)


class _Pieces:
    """Incremental detokenisation of each row as its tokens arrive (what `token_pieces` does
    for a whole completion): a row's pieces join to its decoded text; a row that ended (end
    of sequence, or padding after a stop) adds nothing more."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, rows: int, eos: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos = eos
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.texts = [""] * rows
        self.done = [False] * rows

    def step(self, tokens: Sequence[int | None]) -> list[str]:
        """Each row's text for its token of this step; None: the row sampled nothing (vLLM
        reports a row only when it has new tokens)."""
        pieces = []
        for row, token in enumerate(tokens):
            if self.done[row] or token is None:
                pieces.append("")
                continue
            self.ids[row].append(int(token))
            self.done[row] = int(token) in self.eos
            text = self.tokenizer.decode(self.ids[row], skip_special_tokens=True)
            if text.endswith("\ufffd"):  # a character's bytes not all there yet
                pieces.append("")
                continue
            pieces.append(text[len(self.texts[row]):])
            self.texts[row] = text
        return pieces


def _generate_streaming(engine: Any, prompts: list[list[int]], *, n: int, sampling: SamplingSpec, key: str
                        ) -> list[list[Sample]]:
    """`engine.generate` with each decoding step's text pushed to the web process
    (apps/envapi/token_stream.py) while the generation goes on."""

    writer = StreamWriter(key)
    tokenizer = engine.tokenizer
    eos = {t for t in (tokenizer.eos_token_id,) if t is not None}
    config_eos = getattr(getattr(getattr(engine, "model", None), "generation_config", None), "eos_token_id", None)
    eos |= set(config_eos if isinstance(config_eos, list) else [config_eos] if config_eos is not None else [])
    pieces = _Pieces(tokenizer, n, eos)

    def on_tokens(tokens: list[int | None]) -> None:
        step = pieces.step(tokens)
        if any(step):
            writer.push({"t": "tok", "p": step})

    writer.push({"t": "start"})
    try:
        outputs: list[list[Sample]] = engine.generate(prompts, n=n, sampling=sampling, on_tokens=on_tokens)
        return outputs
    finally:
        writer.push({"t": "end"})


def chat_serve(*, run_id: int, request: Mapping[str, Any]) -> ChatAnswer:
    """`chat_generate`, with the answer (or, when it raises, what failed) also pushed onto the
    request's `reply_key` where it names one (apps/envapi/token_stream.py): the web side waits
    there, not on Celery's result backend."""
    reply = request.get("reply_key")
    if not reply:
        return chat_generate(run_id=run_id, request=request)

    try:
        answer = chat_generate(run_id=run_id, request=request)
    except BaseException as exc:
        # The caller learns now, not when its wait times out.
        reply_push(str(reply), {"failed": f"{type(exc).__name__}: {exc}"})
        raise
    reply_push(str(reply), answer)
    return answer


def chat_generate(*, run_id: int, request: Mapping[str, Any]) -> ChatAnswer:
    """Serve one request: {"endpoint": "chat"|"completion", "messages"|"prompts", "tools",
    "tool_choice", "n", "sampling": {...}, "version"}. Returns {"model_version", "prompts":
    [{"prompt_token_ids", "choices": [...]}]} or {"error": {...}} for a request it refuses."""
    try:
        return _generate(run_id=run_id, request=request)
    except ChatRequestInvalid as exc:
        return {"error": {"message": str(exc), "param": exc.param, "status": exc.status, "code": exc.openai_code}}


# run id -> (config digest, the run as read then). The web side sends the digest of the
# config it read for the call (apps/envapi/openai_services.py), so a call whose digest
# matches needs no query here, and an edited config (a feedback settings change) is read
# again on the next call. Only the config and pk of the kept run are used: its
# current_version goes stale, and "current" comes with the request. Bounded: cleared whole
# when full; one dict assignment per miss, safe across a pool's threads.
_RUNS: dict[int, tuple[str, RunView]] = {}
_RUNS_MAX = 256


def _run_for(*, run_id: int, digest: object) -> RunView | None:
    if isinstance(digest, str):
        kept = _RUNS.get(run_id)
        if kept is not None and kept[0] == digest:
            return kept[1]
    run = run_view(run_id)
    if run is None:
        _RUNS.pop(run_id, None)
        return None
    if len(_RUNS) >= _RUNS_MAX:
        _RUNS.clear()
    _RUNS[run_id] = (run.config_digest, run)
    return run


def _version_current(*, run: RunView, floor: int) -> int:
    """The run's current version for a call that asked for "current": the one the web side
    read (`floor`), or a later one of this run the resident engine already holds (the
    explorer loaded it after a publish), so a call queued across a publish neither reads
    the run again nor swaps the engine back to older weights."""

    if not engine_cached(run.config):
        return floor
    engine = engine_for(run.config)
    held = getattr(engine, "version", None)
    if isinstance(held, int) and held > floor and getattr(engine, "path", None) == checkpoint_known(run_id=run.id, version=held):
        return held
    return floor


def _generate(*, run_id: int, request: Mapping[str, Any]) -> ChatAnswer:
    run = _run_for(run_id=run_id, digest=request.get("config_digest"))
    if run is None:
        raise ChatRequestInvalid(f"run {run_id} not found", status=404, code="model_not_found", param="model")
    if request.get("version") is not None:
        version = int(request["version"])
    elif request.get("current") is not None:
        version = _version_current(run=run, floor=int(request["current"]))
    elif request.get("config_digest") is None:
        version = run.current_version  # read just now by _run_for
    else:  # a kept run's current_version is stale
        version = run_current_version(run_id)
    try:
        engine = engine_at(run=run, version=version, worker=worker_name())
    except VersionNotReady:
        raise ChatRequestInvalid(f"run {run_id} has no model version {version}", status=404, code="model_not_found",
                                 param="model") from None
    tokenizer = engine.tokenizer
    base = SamplingSpec.from_config(run.config.sampling)
    try:
        sampling = base.with_overrides({k: v for k, v in dict(request.get("sampling") or {}).items() if k in SAMPLING_KEYS})
    except (TypeError, ValueError) as exc:
        raise ChatRequestInvalid(str(exc)) from None
    n = int(request.get("n") or 1)
    endpoint = request.get("endpoint", "chat")
    tools = request.get("tools") or None
    tool_choice = request.get("tool_choice")
    if endpoint == "chat":
        offered = tools if tool_choice != "none" else None
        prompts = [chat_prompt_ids(tokenizer, messages=request["messages"], tools=offered)]
    else:
        prompts = []
        for p in request["prompts"]:
            prompts.append([int(t) for t in p] if isinstance(p, list) else list(tokenizer(p, add_special_tokens=False)["input_ids"]))
    context = int(getattr(engine, "max_model_len", 0) or 0)
    for p in prompts:
        if not p:
            raise ChatRequestInvalid("the prompt is empty", param="prompt")
        vocab = len(tokenizer)
        if any(t < 0 or t >= vocab for t in p):
            raise ChatRequestInvalid(f"prompt token ids must be from 0 to {vocab - 1}", param="prompt")
        if context and len(p) + sampling.max_tokens > context:
            raise ChatRequestInvalid(
                f"the prompt ({len(p)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the model's context of {context}",
                param="max_tokens", code="context_length_exceeded",
            )
    stream_key = request.get("stream_key")
    if stream_key and len(prompts) == 1 and getattr(engine, "streams_tokens", False):
        outputs = _generate_streaming(engine, prompts, n=n, sampling=sampling, key=str(stream_key))
    else:
        outputs = engine.generate(prompts, n=n, sampling=sampling)
    parse = endpoint == "chat" and bool(tools) and tool_choice != "none"
    answer_prompts: list[ChatPrompt] = []
    for prompt, samples in zip(prompts, outputs, strict=True):
        choices: list[ChatChoice] = []
        for sample in samples:
            choice: ChatChoice = {
                "token_ids": list(sample.token_ids),
                "logprobs": list(sample.logprobs),
                "text": sample.text,
                "finish_reason": sample.finish_reason,
                "pieces": token_pieces(tokenizer, sample.token_ids),
                "tokens": token_texts(tokenizer, sample.token_ids),
            }
            if sample.top_logprobs is not None:
                tops = [list(step) for step in sample.top_logprobs]
                texts = iter(token_texts(tokenizer, [t for step in tops for t, _ in step]))
                choice["top_logprobs"] = [[[next(texts), float(lp)] for _, lp in step] for step in tops]
            if parse:
                content, calls = tool_calls_parse(tokenizer, sample.text)
                choice["content"], choice["tool_calls"] = content, calls
                if calls:
                    choice["finish_reason"] = "tool_calls"
            choices.append(choice)
        answer_prompts.append({"prompt_token_ids": list(prompt), "choices": choices})
    return {"model_version": version, "prompts": answer_prompts}


# OpenAI-compatible generation (apps/envapi/openai_api.py). Its name predates this module holding
# it (it was the explorer's, whose routes it keeps): queued calls and the web side name it so.
# Reads only; the waiting API request decides about retrying. Refusals come back as
# {"error": {...}}, not exceptions, so the web side can answer them as OpenAI 4xx errors.
@celery_task(
    name="workers.explore.chat.chat",
    acks_late=True,
    soft_time_limit=300,
    time_limit=330,
)
def chat(run_id: int, request: JSONObject) -> ChatAnswer | None:
    answer = chat_serve(run_id=run_id, request=request)
    # With a reply list the answer went there, and the sender ignores the result: returning
    # it anyway made Celery walk it for its log line's repr (whether logged or not), ~2% of
    # the worker's CPU per call outside the engine (bench/openai_endpoint).
    return None if request.get("reply_key") else answer
