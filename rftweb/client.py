"""A Python client for the rftweb environment API. Needs only httpx (and the standard library).

    from rftweb.client import RftClient
    with RftClient("http://localhost:8000", api_key="rft_…") as api:
        run = api.run(1)
        batch = api.claim_tasks(1, size=4)
        ...
        api.submit_trajectory(1, key="episode-1", messages=[...], reward=1.0)

Every call retries with exponential backoff on 429 (honouring Retry-After), on 5xx and on
connection errors; trajectory submission is idempotent on its key, so a retry never
writes twice. A final failure raises ApiError with the server's message and field errors.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypedDict, cast
from urllib.parse import quote

import httpx

__all__ = ["ApiError", "RftClient", "environment_args", "environment_parser"]

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

# A JSON value as the API sends it (as kernel.jsontypes has it: this module needs only httpx).
JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"
JSONObject: TypeAlias = "dict[str, JSON]"
QueryParams = Mapping[str, "str | int | float"]


class ApiError(Exception):
    """The API answered with an error (after retries, where they apply)."""

    def __init__(self, status: int, detail: str, errors: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.detail = detail
        self.errors = dict(errors or {})
        super().__init__(f"{status}: {detail}")


# ---- typed results (mirror apps/envapi/schemas.py) -----------------------------------


class ModelVersion(TypedDict):
    number: int
    checkpoint: str
    train_step: int
    created_at: str | None


# Free-form JSON that the environment itself wrote and reads as it knows it (a task's
# reference and metadata, the run's config, an event's payload) stays Any: an
# environment's script (examples/) reads it without narrowing each value.


class Run(TypedDict):
    id: int
    name: str
    status: str
    config: dict[str, Any]
    taskset_id: int | None
    current_version: ModelVersion
    explore_step: int
    train_step: int
    created_at: str


class Task(TypedDict):
    attempt_id: int
    task_id: int
    epoch: int
    prompt: str
    messages: list[JSONObject] | None
    reference: Any
    domain: str
    metadata: dict[str, Any]


class TaskClaim(TypedDict):
    worker: str
    lease_expires_at: str | None
    tasks: list[Task]


class TasksAdded(TypedDict):
    taskset_id: int
    task_ids: list[int]


class Completion(TypedDict):
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class Rollout(TypedDict):
    prompt_token_ids: list[int]
    model_version: int
    completions: list[Completion]


class TrajectoryResult(TypedDict):
    key: str
    id: int
    duplicate: bool


class SubmitResult(TypedDict):
    created: int
    duplicates: int
    results: list[TrajectoryResult]


class FeedbackResult(TypedDict):
    id: int
    kind: str
    experience_id: int | None
    group_id: str
    late: bool
    value: JSONObject
    experience_status: str | None
    experience_reward: float | None


class Event(TypedDict):
    type: str
    payload: Any


def environment_parser(description: str) -> argparse.ArgumentParser:
    """The command line of an environment script: where the platform is (--url, else
    RFT_URL), its API key (--key, else RFT_API_KEY) and the run (--run); add your own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", default=os.environ.get("RFT_URL", "http://localhost:8000"))
    parser.add_argument("--key", default=os.environ.get("RFT_API_KEY"), help="API key (or RFT_API_KEY)")
    parser.add_argument("--run", type=int, required=True)
    return parser


def environment_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`parser`'s arguments, refused (exit 2, with the usage) when no API key was given."""
    args = parser.parse_args(argv)
    if not args.key:
        parser.error("give --key or set RFT_API_KEY")
    return args


def _feedback_kinds(schema: JSON) -> list[str]:
    """The `kind` each body of the feedback route's request names, in an OpenAPI document."""
    if not isinstance(schema, dict):
        raise ApiError(200, "the API schema is not a JSON object")
    paths = schema.get("paths")
    route = next((v for k, v in paths.items() if k.endswith("/runs/{run_id}/feedback")), None) \
        if isinstance(paths, dict) else None
    body = _json_at(route, "post", "requestBody", "content", "application/json", "schema")
    components = _json_at(schema, "components", "schemas")
    kinds: list[str] = []
    for option in _json_list(_json_at(body, "oneOf")):
        ref = _json_at(option, "$ref")
        if isinstance(ref, str) and isinstance(components, dict):  # "#/components/schemas/<Name>"
            option = components.get(ref.rsplit("/", 1)[-1])
        kind = _json_at(option, "properties", "kind", "const")
        if isinstance(kind, str):
            kinds.append(kind)
    if not kinds:
        raise ApiError(200, "the API schema lists no feedback kinds (POST /runs/{run_id}/feedback)")
    return kinds


def _json_at(value: JSON, *keys: str) -> JSON:
    """value[k1][k2]...; None where a step is missing or not an object."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _json_list(value: JSON) -> list[JSON]:
    return value if isinstance(value, list) else []


class RftClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.attempts = 0  # requests sent, retries included: for logs and tests
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> RftClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---- plumbing ----------------------------------------------------------------

    def _wait(self, attempt: int, response: httpx.Response | None) -> float:
        retry_after = response.headers.get("Retry-After") if response is not None else None
        if retry_after is not None:
            try:
                return min(float(retry_after), self.max_backoff)
            except ValueError:
                pass
        # Full jitter: many environments retrying at once do not stampede the server.
        return random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))

    def _request(self, method: str, path: str, *, json_body: object = None, params: QueryParams | None = None,
                 timeout: float | None = None) -> JSON:
        attempt = 0
        while True:
            self.attempts += 1
            response: httpx.Response | None = None
            try:
                response = self._http.request(
                    method, path, json=json_body, params=params,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError:
                if attempt >= self.retries:
                    raise
            else:
                if response.status_code < 400:
                    answer: JSON = response.json()
                    return answer
                if response.status_code not in RETRY_STATUSES or attempt >= self.retries:
                    raise self._error(response)
            time.sleep(self._wait(attempt, response))
            attempt += 1

    @staticmethod
    def _error(response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            return ApiError(response.status_code, response.text[:500] or response.reason_phrase)
        if isinstance(body, dict):
            detail = body.get("detail")
            errors = body.get("errors") if isinstance(body.get("errors"), dict) else {}
            return ApiError(response.status_code, str(detail), errors)
        return ApiError(response.status_code, str(body))

    # ---- runs ----------------------------------------------------------------------

    def runs(self) -> list[Run]:
        return cast(list[Run], self._request("GET", "/runs"))

    def run(self, run_id: int) -> Run:
        return cast(Run, self._request("GET", f"/runs/{run_id}"))

    # ---- tasks ---------------------------------------------------------------------

    def claim_tasks(self, run_id: int, *, size: int = 1, lease_seconds: float | None = None, worker: str = "") -> TaskClaim:
        body: dict[str, object] = {"size": size, "worker": worker}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        return cast(TaskClaim, self._request("POST", f"/runs/{run_id}/tasks/claim", json_body=body))

    def release_tasks(self, run_id: int, *, attempt_ids: Sequence[int] | None = None, worker: str = "") -> int:
        body = {"attempt_ids": list(attempt_ids) if attempt_ids is not None else None, "worker": worker}
        return int(cast(dict[str, int], self._request("POST", f"/runs/{run_id}/tasks/release", json_body=body))["count"])

    def finish_tasks(self, run_id: int, *, attempt_ids: Sequence[int], model_version: int | None = None,
                     worker: str = "") -> int:
        body = {"attempt_ids": list(attempt_ids), "model_version": model_version, "worker": worker}
        return int(cast(dict[str, int], self._request("POST", f"/runs/{run_id}/tasks/finish", json_body=body))["count"])

    def add_tasks(self, run_id: int, tasks: Sequence[Mapping[str, object]]) -> TasksAdded:
        return cast(TasksAdded, self._request("POST", f"/runs/{run_id}/tasks", json_body={"tasks": list(tasks)}))

    # ---- rollouts ------------------------------------------------------------------

    def generate(self, run_id: int, requests: Sequence[Mapping[str, object]], *, timeout_seconds: float = 60.0) -> list[Rollout]:
        """Each request: {"prompt": str} or {"messages": [...]}, plus n, max_tokens,
        temperature, top_p, top_k, stop, seed."""
        body = {"requests": list(requests), "timeout_seconds": timeout_seconds}
        answer = self._request("POST", f"/runs/{run_id}/rollouts", json_body=body, timeout=timeout_seconds + 10)
        return cast(dict[str, list[Rollout]], answer)["results"]

    # ---- trajectories --------------------------------------------------------------

    def submit_trajectories(self, run_id: int, trajectories: Sequence[Mapping[str, object]]) -> SubmitResult:
        return cast(SubmitResult, self._request(
            "POST", f"/runs/{run_id}/trajectories", json_body={"trajectories": list(trajectories)}
        ))

    def submit_trajectory(self, run_id: int, *, key: str, **fields: object) -> TrajectoryResult:
        return self.submit_trajectories(run_id, [{"key": key, **fields}])["results"][0]

    # ---- agent sessions ------------------------------------------------------------

    def finish_session(self, run_id: int, session: str, *, reward: float,
                       reward_parts: Mapping[str, float] | None = None) -> JSONObject:
        """Finish an agent session of the OpenAI-compatible endpoint: its recorded calls become
        experiences with `reward` ({"experience_ids", "splits", "turns", ...})."""
        body = {"reward": reward, "reward_parts": dict(reward_parts or {})}
        return cast(JSONObject, self._request("POST", f"/runs/{run_id}/sessions/{quote(session, safe='')}/finish",
                                                  json_body=body))

    # ---- feedback ------------------------------------------------------------------

    def feedback(
        self,
        run_id: int,
        *,
        kind: str,
        experience_id: int | None = None,
        value: float | None = None,
        reward_parts: Mapping[str, float] | None = None,
        score: int | None = None,
        thumb: Literal["up", "down"] | None = None,
        other_experience_id: int | None = None,
        winner: Literal["a", "b", "tie"] | None = None,
        preferred: Literal["a", "b", "tie"] | None = None,
        order: Sequence[int] | None = None,
        flags: Sequence[Literal["unsafe", "broken", "off_task"]] | None = None,
        reason: str | None = None,
        comment: str = "",
        fields: Mapping[str, JSON] | None = None,
    ) -> FeedbackResult:
        """One piece of feedback of any kind the server takes (`feedback_kinds()` reads them
        from its API schema; another is refused with a 422 naming them). env_reward: value
        (+ reward_parts); rating: score 1-5 or thumb; pairwise: other_experience_id + winner;
        ranking: order (a whole group, best first); flag: flags and/or reason; a kind of the
        deployment's own (a plugin): its fields in `fields`, as its body in the schema names
        them. The stored value is the annotation page's."""
        body: dict[str, object] = {"kind": kind, "comment": comment, **(fields or {})}
        for name, v in (("experience_id", experience_id), ("value", value),
                        ("reward_parts", dict(reward_parts) if reward_parts else None), ("score", score),
                        ("thumb", thumb), ("other_experience_id", other_experience_id), ("winner", winner),
                        ("preferred", preferred), ("order", list(order) if order is not None else None),
                        ("flags", list(flags) if flags else None), ("reason", reason)):
            if v is not None:
                body[name] = v
        return cast(FeedbackResult, self._request("POST", f"/runs/{run_id}/feedback", json_body=body))

    def feedback_kinds(self) -> list[str]:
        """The kinds of feedback the server takes, as its API schema lists them (the feedback
        route's body is one model per kind, each naming its `kind`), in the schema's order."""
        return _feedback_kinds(self._request("GET", "/openapi.json"))

    # ---- events --------------------------------------------------------------------

    def events(self, run_id: int, *, max_seconds: float | None = None, max_events: int | None = None) -> Iterator[Event]:
        """The run's live events as they happen (server-sent events). The first item is
        {"type": "subscribed"} once the stream is live."""
        params: dict[str, float | int] = {}
        if max_seconds is not None:
            params["max_seconds"] = max_seconds
        if max_events is not None:
            params["max_events"] = max_events
        self.attempts += 1
        with self._http.stream("GET", f"/runs/{run_id}/events", params=params, timeout=httpx.Timeout(30.0, read=None)) as response:
            if response.status_code >= 400:
                response.read()
                raise self._error(response)
            yield from _parse_sse(response.iter_lines())


def _parse_sse(lines: Iterator[str]) -> Iterator[Event]:
    kind, data = "message", list[str]()
    for line in lines:
        if line == "":
            if data:
                yield {"type": kind, "payload": json.loads("\n".join(data))}
            kind, data = "message", []
        elif line.startswith(": subscribed"):
            yield {"type": "subscribed", "payload": None}
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
