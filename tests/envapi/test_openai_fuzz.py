"""No input crashes the OpenAI endpoint: generated requests, valid and broken, against a live
server with a real rollout worker always get a well-formed answer or an OpenAI-shaped 4xx.

Each request starts from a valid one and has some of its fields replaced by arbitrary JSON
(or by values at the edges of what the field takes: huge and negative numbers, token ids the
vocabulary does not hold, prompts longer than the model's context), so both the validation and
what passes it into the worker and the engine are exercised.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.envapi.conftest import make_key
from tests.envapi.test_openai_endpoint import agent_run, model_dir, rollout_worker, stack  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EDGE_INTS = st.sampled_from([0, -1, 1, 2, 7, 255, 256, 4096, 2**31 - 1, 2**31, 2**63, -(2**63) - 1, 10**30])
EDGE_FLOATS = st.sampled_from([0.0, -0.0, 1e-300, 0.5, 1.0, 2.0, 2.0000001, -1.0, 1e308])
SCALARS = st.one_of(st.none(), st.booleans(), EDGE_INTS, st.integers(), EDGE_FLOATS,
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                    max_leaves=12)

TOOL = {"type": "function", "function": {"name": "calc", "description": "arithmetic",
                                         "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}
MESSAGES = st.one_of(
    JSON,
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"]),
                                    "content": st.one_of(st.text(max_size=60), st.none(), JSON)},
                                   optional={"tool_calls": JSON, "tool_call_id": st.text(max_size=10), "name": JSON}),
             min_size=0, max_size=4),
    st.just([{"role": "user", "content": "1 " * 5000}]),  # far beyond the model's context
    st.just([{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "calc", "arguments": "{\"expr\": \"2+2\"}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "4"}]),
)
PROMPTS = st.one_of(
    JSON, st.text(max_size=80),
    st.lists(st.integers(min_value=0, max_value=2**31 - 1), min_size=1, max_size=8),  # ids past the vocabulary
    st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8),
    st.just(list(range(40)) * 200),  # longer than the context
    st.lists(st.text(max_size=20), min_size=1, max_size=3),
)
SAMPLING = {
    "n": st.one_of(EDGE_INTS, JSON), "temperature": st.one_of(EDGE_FLOATS, JSON), "top_p": st.one_of(EDGE_FLOATS, JSON),
    "max_tokens": st.one_of(EDGE_INTS, JSON), "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=5), JSON),
    "seed": st.one_of(EDGE_INTS, JSON), "stream": st.one_of(st.booleans(), JSON),
    "stream_options": st.one_of(st.just({"include_usage": True}), JSON), "user": JSON, "metadata": JSON,
    "presence_penalty": st.one_of(EDGE_FLOATS, JSON), "logit_bias": JSON, "return_token_ids": st.one_of(st.booleans(), JSON),
    "model": st.one_of(st.just("run-0"), st.text(max_size=20), JSON), "unknown_field": JSON,
}
CHAT = {**SAMPLING, "messages": MESSAGES, "max_completion_tokens": st.one_of(EDGE_INTS, JSON),
        "logprobs": st.one_of(st.booleans(), JSON), "top_logprobs": st.one_of(EDGE_INTS, JSON),
        "tools": st.one_of(st.just([TOOL]), JSON), "response_format": st.one_of(st.just({"type": "text"}), JSON),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]),
                                 st.just({"type": "function", "function": {"name": "calc"}}), JSON),
        "parallel_tool_calls": JSON}
COMPLETION = {**SAMPLING, "prompt": PROMPTS, "logprobs": st.one_of(EDGE_INTS, JSON), "echo": st.one_of(st.booleans(), JSON),
              "suffix": JSON, "best_of": JSON}


def mutated(valid: dict[str, Any], fields: dict[str, Any]) -> Any:
    """The valid body with 1-4 of its fields set to generated values (or dropped)."""
    names = sorted(fields)
    return st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({n: st.one_of(fields[n], st.just(_DROP)) for n in chosen})
    ).map(lambda changes: {k: v for k, v in {**valid, **changes}.items() if v is not _DROP})


_DROP = object()


def assert_well_formed(response: httpx.Response, *, body: Any) -> None:
    assert response.status_code < 500, f"{response.status_code} for {json.dumps(body)[:500]}: {response.text[:500]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", response.text[-300:]
        for event in events[:-1]:
            chunk = json.loads(event)
            assert "error" not in chunk, chunk
        return
    answer = response.json()
    assert answer["choices"] and all("finish_reason" in c for c in answer["choices"])
    assert answer["usage"]["completion_tokens"] >= 0


def _fuzz(stack: str, run: Any, *, path: str, valid: dict[str, Any], fields: dict[str, Any], examples: int) -> None:
    _, raw = make_key(run)
    url = f"{stack}/api/v1/runs/{run.pk}/openai/v1/{path}"
    statuses: list[int] = []
    with httpx.Client(headers={"Authorization": f"Bearer {raw}"}, timeout=120) as http:

        @given(body=mutated(valid, fields))
        @hsettings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(body: Any) -> None:
            # Small generations: the point is what reaches the worker, not how long it writes.
            if isinstance(body.get("max_tokens"), int) and 0 < body["max_tokens"] <= 2**31:
                body["max_tokens"] = min(body["max_tokens"], 8)
            response = http.post(url, content=json.dumps(body), headers={"Content-Type": "application/json"})
            assert_well_formed(response, body=body)
            statuses.append(response.status_code)

        check()
    # Both sides were reached: generations on the worker, and refusals.
    assert statuses.count(200) >= 3 and sum(400 <= s < 500 for s in statuses) >= 3, statuses


def test_no_chat_completion_request_gets_a_server_error(stack: str, agent_run: Any) -> None:  # noqa: F811
    valid = {"model": f"run-{agent_run.pk}", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}
    _fuzz(stack, agent_run, path="chat/completions", valid=valid, fields=CHAT, examples=60)


def test_no_completion_request_gets_a_server_error(stack: str, agent_run: Any) -> None:  # noqa: F811
    valid = {"model": f"run-{agent_run.pk}", "prompt": "2 + 3 =", "max_tokens": 4}
    _fuzz(stack, agent_run, path="completions", valid=valid, fields=COMPLETION, examples=60)
