"""Services of the OpenAI-compatible endpoint: model names, generation on a rollout worker,
and the response bodies OpenAI's clients expect.

A run's models are named `run-<id>` (its current version) and `run-<id>@v<N>` (version N).
Generation is one `workers.explore.chat.chat` task on the `rollout` queue (`workers/explore/chat.py`);
its answer carries the exact token ids and logprobs, which the session recorder keeps.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict, cast

from apps.envapi.openai_schemas import ChatCompletionIn, CompletionIn
from apps.envapi.services import rollout_task_send, rollout_task_wait
from apps.runs.models import ModelVersion, Run
from kernel.exceptions import RftError, Unavailable, UpstreamFailed
from kernel.jsontypes import Body
from apps.envapi import token_stream

# What a rollout worker answers (workers/explore/chat.py `chat_generate`), once `_answer_checked`
# has seen its shape.


class AnswerChoice(TypedDict):
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    pieces: list[str]  # the text a token at a time: they join to `text`
    tokens: list[str]  # each token decoded on its own
    # Per token, [text, logprob] of the most likely tokens (lists once through JSON).
    top_logprobs: NotRequired[list[list[tuple[str, float]]]]
    content: NotRequired[str | None]  # with tools offered: the text before the first call
    tool_calls: NotRequired[list[Body]]


class AnswerPrompt(TypedDict):
    prompt_token_ids: list[int]
    choices: list[AnswerChoice]


class WorkerAnswer(TypedDict):
    model_version: int
    prompts: list[AnswerPrompt]

CHAT_TASK = "workers.explore.chat.chat"
_MODEL = re.compile(r"^run-(\d+)(?:@v(\d+))?$")


class OpenAIError(RftError):
    """An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with `status`."""

    code = "openai_error"

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
             429: "rate_limit_error", 502: "server_error", 503: "server_error"}

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        # OpenAI's own error codes (invalid_api_key, model_not_found, …), what its clients
        # branch on; not the REST API's CODES (rftweb/exceptions.py).
        self.openai_code = code
        self.headers = headers or {}

    def body(self) -> Body:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.openai_code}}


def model_name(*, run: Run, version: int | None = None) -> str:
    return f"run-{run.pk}" if version is None else f"run-{run.pk}@v{version}"


def model_resolve(*, run: Run, name: str) -> int | None:
    """The version a model name asks for (None: the current one); OpenAIError 404 for a name
    that is not one of this run's models."""
    match = _MODEL.match(name.strip())
    if match is None or int(match.group(1)) != run.pk:
        raise OpenAIError(404, f"the model {name!r} does not exist here; this run's models are "
                               f"{model_name(run=run)!r} (current version) and {model_name(run=run)}@v<N>",
                          param="model", code="model_not_found")
    if match.group(2) is None:
        return None
    version = int(match.group(2))
    if version != 0 and not ModelVersion.objects.filter(run=run, number=version).exists():
        raise OpenAIError(404, f"run {run.pk} has no model version {version}", param="model", code="model_not_found")
    return version


def models_list(*, run: Run) -> Body:
    created = int(run.created_at.timestamp())
    data: list[Body] = [{"id": model_name(run=run), "object": "model", "created": created, "owned_by": "rftweb",
             "current_version": run.current_version}]
    data.append({"id": model_name(run=run, version=0), "object": "model", "created": created, "owned_by": "rftweb"})
    for number, at in ModelVersion.objects.filter(run=run).order_by("number").values_list("number", "created_at"):
        data.append({"id": model_name(run=run, version=number), "object": "model",
                     "created": int(at.timestamp()), "owned_by": "rftweb"})
    return {"object": "list", "data": data}


def _sampling(req: ChatCompletionIn | CompletionIn, *, top: int, limit: int | None) -> Body:
    sampling: Body = {"logprobs": top}
    for name in ("temperature", "top_p", "seed"):
        value = getattr(req, name)
        if value is not None:
            sampling[name] = value
    if limit is not None:
        sampling["max_tokens"] = limit
    if req.stop is not None:
        sampling["stop"] = req.stops()
    return sampling


def chat_request_build(*, req: ChatCompletionIn, version: int | None) -> Body:
    """What `workers/explore/chat.py` gets for a chat completion."""
    return {
        "endpoint": "chat",
        "messages": [m.for_template() for m in req.messages],
        "tools": [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None,
        "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) else None,
        "n": req.n,
        "sampling": _sampling(req, top=(req.top_logprobs or 0) if req.logprobs else 0, limit=req.token_limit()),
        "version": version,
    }


def completion_request_build(*, req: CompletionIn, version: int | None) -> Body:
    return {
        "endpoint": "completion",
        "prompts": req.prompts(),
        "n": req.n,
        "sampling": _sampling(req, top=req.logprobs or 0, limit=req.max_tokens),
        "version": version,
    }


def worker_request_build(*, run: Run, request: Mapping[str, object]) -> Body:
    """The request with what this process already read of the run, so the worker need not
    read it again per call (workers/explore/chat.py): the current version as the floor of "current",
    and the config's digest, under which the worker keeps the config it read last."""
    return {**request, "current": run.current_version, "config_digest": run.config_digest}


def openai_generate(*, run: Run, request: Body, timeout: float) -> WorkerAnswer:
    """Send one request to a rollout worker and wait; OpenAIError for what the worker
    refused, Unavailable / UpstreamFailed as the environment API's rollouts raise."""
    request = worker_request_build(run=run, request=request)
    return _answer_checked(rollout_task_wait(task=CHAT_TASK, args=[run.pk, request], timeout=timeout))


async def openai_generate_replied(*, run: Run, request: Body, timeout: float) -> WorkerAnswer:
    """`openai_generate` with the answer coming back on a Redis list (token_stream.reply_*)
    the event loop waits on, not through Celery's result backend; needs Redis."""
    from asgiref.sync import sync_to_async


    key = token_stream.reply_key_new()
    if key is None:
        raise ValueError("replies need Redis")
    request = {**worker_request_build(run=run, request=request), "reply_key": key}
    # Publishing may block (a reconnect): off the event loop.
    result = await sync_to_async(rollout_task_send, thread_sensitive=False)(
        task=CHAT_TASK, args=[run.pk, request], timeout=timeout, ignore_result=True)
    try:
        answer = await token_stream.reply_wait(key, timeout=timeout)
    except Exception as exc:  # Redis went away while waiting
        raise Unavailable(f"lost the connection to Redis while waiting for the rollout worker ({exc})") from None
    if answer is None:
        await sync_to_async(result.revoke, thread_sensitive=False)()
        raise Unavailable(f"no rollout worker answered within {timeout:g} s")
    if "failed" in answer:
        raise UpstreamFailed(f"the rollout worker failed: {answer['failed']}")
    return _answer_checked(answer)


def _answer_checked(answer: object) -> WorkerAnswer:
    if not isinstance(answer, dict):
        raise UpstreamFailed("the rollout worker returned a malformed result")
    if "error" in answer:
        err = answer["error"] or {}
        raise OpenAIError(int(err.get("status") or 400), str(err.get("message") or "refused"),
                          param=err.get("param"), code=err.get("code"))
    prompts = answer.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, dict) and p.get("choices") for p in prompts):
        raise UpstreamFailed("the rollout worker returned a malformed result")
    return cast(WorkerAnswer, answer)


# ---- response bodies -----------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    id: str
    created: int
    model: str
    fingerprint: str


def envelope(*, endpoint: str, model: str, run: Run, version: int) -> Envelope:
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    return Envelope(id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=model,
                    fingerprint=f"rft-run{run.pk}-v{version}")


def usage(answer: WorkerAnswer) -> dict[str, int]:
    prompt = sum(len(p["prompt_token_ids"]) for p in answer["prompts"])
    completion = sum(len(c["token_ids"]) for p in answer["prompts"] for c in p["choices"])
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def _chat_logprob(token: str, logprob: float, top: list[tuple[str, float]] | None) -> Body:
    return {
        "token": token, "logprob": logprob, "bytes": _bytes(token),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": _bytes(t)} for t, lp in (top or [])],
    }


def _chat_logprobs(choice: AnswerChoice, *, start: int = 0, stop: int | None = None) -> Body:
    tops = choice.get("top_logprobs")
    idx = range(len(choice["token_ids"]))[start:stop]
    return {"content": [_chat_logprob(choice["tokens"][i], choice["logprobs"][i], tops[i] if tops else None) for i in idx],
            "refusal": None}


class Message(TypedDict):
    role: str
    content: str | None
    refusal: None
    tool_calls: NotRequired[list[Body]]


def _message(choice: AnswerChoice) -> Message:
    calls = choice.get("tool_calls") or []
    content = choice.get("content", choice["text"]) if "content" in choice else choice["text"]
    message: Message = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_body(*, req: ChatCompletionIn, answer: WorkerAnswer, env: Envelope) -> Body:
    [prompt] = answer["prompts"]
    choices = []
    for i, c in enumerate(prompt["choices"]):
        choice: Body = {"index": i, "message": _message(c), "logprobs": _chat_logprobs(c) if req.logprobs else None,
                                  "finish_reason": c["finish_reason"]}
        if req.return_token_ids:
            choice["token_ids"] = c["token_ids"]
        choices.append(choice)
    body: Body = {"id": env.id, "object": "chat.completion", "created": env.created, "model": env.model,
                            "system_fingerprint": env.fingerprint, "choices": choices, "usage": usage(answer)}
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt["prompt_token_ids"]
    return body


def _completion_logprobs(choice: AnswerChoice) -> Body:
    offsets, at = [], 0
    for piece in choice["pieces"]:
        offsets.append(at)
        at += len(piece)
    tops = choice.get("top_logprobs")
    return {"tokens": choice["tokens"], "token_logprobs": choice["logprobs"],
            "top_logprobs": [{t: lp for t, lp in step} for step in tops] if tops else None, "text_offset": offsets}


def completion_body(*, req: CompletionIn, answer: WorkerAnswer, env: Envelope) -> Body:
    choices: list[Body] = []
    for p in answer["prompts"]:
        for c in p["choices"]:
            choice: Body = {"index": len(choices), "text": c["text"], "finish_reason": c["finish_reason"],
                                      "logprobs": _completion_logprobs(c) if req.logprobs is not None else None}
            if req.return_token_ids:
                choice["prompt_token_ids"] = p["prompt_token_ids"]
                choice["token_ids"] = c["token_ids"]
            choices.append(choice)
    return {"id": env.id, "object": "text_completion", "created": env.created, "model": env.model,
            "system_fingerprint": env.fingerprint, "choices": choices, "usage": usage(answer)}


def _clipped_pieces(choice: AnswerChoice, text: str) -> Iterator[tuple[int, str]]:
    """(token index, piece) whose pieces join to `text`: a stop string the engine cut from
    the text, or a tool call after the content, ends the stream of pieces early."""
    sent = ""
    for i, piece in enumerate(choice["pieces"]):
        if not piece:
            continue
        if text.startswith(sent + piece):
            sent += piece
            yield i, piece
        else:
            rest = text[len(sent):]
            if rest and text.startswith(sent):
                yield i, rest
            return


def chat_chunks(*, req: ChatCompletionIn, answer: WorkerAnswer, env: Envelope) -> Iterator[Body]:
    """The answer as OpenAI's `chat.completion.chunk`s: per choice the role, the content a
    token at a time (with its logprobs when asked), the tool calls, the finish reason; then
    the usage when `stream_options.include_usage`."""
    [prompt] = answer["prompts"]
    usage_last = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(choices: list[Body]) -> Body:
        out: Body = {"id": env.id, "object": "chat.completion.chunk", "created": env.created,
                               "model": env.model, "system_fingerprint": env.fingerprint, "choices": choices}
        if usage_last:
            out["usage"] = None
        return out

    for i, c in enumerate(prompt["choices"]):
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
        content = _message(c)["content"] or ""
        for t, piece in _clipped_pieces(c, content):
            logprobs = _chat_logprobs(c, start=t, stop=t + 1) if req.logprobs else None
            yield chunk([{"index": i, "delta": {"content": piece}, "logprobs": logprobs, "finish_reason": None}])
        calls = c.get("tool_calls") or []
        if calls:
            yield chunk([{"index": i, "delta": {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]},
                          "logprobs": None, "finish_reason": None}])
        yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]}])
    if usage_last:
        out = chunk([])
        out["usage"] = usage(answer)
        yield out


def completion_chunks(*, req: CompletionIn, answer: WorkerAnswer, env: Envelope) -> Iterator[Body]:
    usage_last = bool(req.stream_options and req.stream_options.include_usage)
    index = 0
    for p in answer["prompts"]:
        for c in p["choices"]:
            for _, piece in _clipped_pieces(c, c["text"]):
                yield {"id": env.id, "object": "text_completion", "created": env.created, "model": env.model,
                       "choices": [{"index": index, "text": piece, "logprobs": None, "finish_reason": None}]}
            yield {"id": env.id, "object": "text_completion", "created": env.created, "model": env.model,
                   "choices": [{"index": index, "text": "", "logprobs": None, "finish_reason": c["finish_reason"]}]}
            index += 1
    if usage_last:
        yield {"id": env.id, "object": "text_completion", "created": env.created, "model": env.model,
               "choices": [], "usage": usage(answer)}


# ---- live streaming (apps/envapi/token_stream.py) -------------------------------------


def live_streamable(req: ChatCompletionIn | CompletionIn) -> bool:
    """Whether `stream: true` can send text as the worker samples it: one prompt, and no
    per-token logprobs (they are known once the generation ends); otherwise the chunks go
    out when the answer is whole."""
    if not req.stream:
        return False
    if isinstance(req, ChatCompletionIn):
        return not req.logprobs
    return req.logprobs is None and len(req.prompts()) == 1


def live_markers(req: ChatCompletionIn | CompletionIn) -> list[str]:
    """Text that ends what may be streamed as content: stop strings (the engine cuts the text
    there) and, with tools offered, the start of a tool call (sent as `tool_calls` at the end)."""
    markers = list(req.stops()) if req.stop is not None else []
    if isinstance(req, ChatCompletionIn) and req.tools and req.tool_choice != "none":
        markers.append("<tool_call>")
    return [m for m in markers if m]


class LiveText:
    """One choice's text as pieces arrive: `add` returns what may go out now, holding back a
    tail that could be the start of a marker and everything from a marker on; `rest` is what
    the final answer adds to what went out."""

    def __init__(self, markers: Sequence[str]) -> None:
        self.markers = [m for m in markers if m]
        self.longest = max((len(m) for m in self.markers), default=0)
        self.text = ""
        self.sent = ""
        self.closed = False

    def add(self, piece: str) -> str:
        if self.closed or not piece:
            return ""
        self.text += piece
        safe = self.text
        for marker in self.markers:
            at = safe.find(marker)
            if at >= 0:
                safe, self.closed = safe[:at], True
        if not self.closed:
            hold = 0
            for k in range(1, min(len(safe), self.longest - 1) + 1):
                if any(m.startswith(safe[-k:]) for m in self.markers):
                    hold = k
            safe = safe[: len(safe) - hold]
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        out, self.sent = safe[len(self.sent):], safe
        return out

    def rest(self, final: str) -> str:
        return final[len(self.sent):] if final.startswith(self.sent) else ""


def chat_chunk(*, req: ChatCompletionIn, env: Envelope, choices: list[Body]) -> Body:
    out: Body = {"id": env.id, "object": "chat.completion.chunk", "created": env.created, "model": env.model,
                           "system_fingerprint": env.fingerprint, "choices": choices}
    if req.stream_options and req.stream_options.include_usage:
        out["usage"] = None
    return out


def chat_live_head(*, req: ChatCompletionIn, env: Envelope) -> Iterator[Body]:
    for i in range(req.n):
        yield chat_chunk(req=req, env=env, choices=[
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])


def chat_live_piece(*, req: ChatCompletionIn, env: Envelope, index: int, text: str) -> Body:
    return chat_chunk(req=req, env=env, choices=[
        {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}])


def chat_live_tail(*, req: ChatCompletionIn, answer: WorkerAnswer, env: Envelope,
                   live: Sequence[LiveText]) -> Iterator[Body]:
    """After the streamed text: per choice the content the answer adds (a stop string's cut,
    text the markers held back), its tool calls, its finish reason; then the usage."""
    [prompt] = answer["prompts"]
    for i, c in enumerate(prompt["choices"]):
        rest = live[i].rest(_message(c)["content"] or "") if i < len(live) else ""
        if rest:
            yield chat_live_piece(req=req, env=env, index=i, text=rest)
        calls = c.get("tool_calls") or []
        if calls:
            yield chat_chunk(req=req, env=env, choices=[
                {"index": i, "delta": {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]},
                 "logprobs": None, "finish_reason": None}])
        yield chat_chunk(req=req, env=env, choices=[
            {"index": i, "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]}])
    if req.stream_options and req.stream_options.include_usage:
        out = chat_chunk(req=req, env=env, choices=[])
        out["usage"] = usage(answer)
        yield out


def completion_live_piece(*, env: Envelope, index: int, text: str) -> Body:
    return {"id": env.id, "object": "text_completion", "created": env.created, "model": env.model,
            "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": None}]}


def completion_live_tail(*, req: CompletionIn, answer: WorkerAnswer, env: Envelope,
                         live: Sequence[LiveText]) -> Iterator[Body]:
    [prompt] = answer["prompts"]
    for i, c in enumerate(prompt["choices"]):
        rest = live[i].rest(c["text"]) if i < len(live) else ""
        if rest:
            yield completion_live_piece(env=env, index=i, text=rest)
        yield {"id": env.id, "object": "text_completion", "created": env.created, "model": env.model,
               "choices": [{"index": i, "text": "", "logprobs": None, "finish_reason": c["finish_reason"]}]}
    if req.stream_options and req.stream_options.include_usage:
        yield {"id": env.id, "object": "text_completion", "created": env.created, "model": env.model,
               "choices": [], "usage": usage(answer)}
