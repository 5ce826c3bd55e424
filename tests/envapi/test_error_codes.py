"""Every API error carries a stable `code` a client can branch on (issue #48): the REST API's
(`/api/v1/`, rftweb/exceptions.py CODES, the Error schema's enum) and the OpenAI door's
(OpenAI's own vocabulary, which its clients know). A test per door for the typical refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from apps.buffer.models import Experience
from apps.envapi.models import AgentSession
from apps.runs.models import Run
from rftweb.api import api as ninja_api
from rftweb.exceptions import CODES, ERROR_CLASS_CODES
from tests.envapi.conftest import Api, make_key

pytestmark = pytest.mark.django_db


def traj(**fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"key": "ep-1", "prompt": "What is 2 + 2?", "response": "<answer>4</answer>", "reward": 1.0}
    item.update(fields)
    return item


def refusal(response: Any, status: int) -> dict[str, Any]:
    """The body of a refusal, after checking its status and the shape every one shares."""
    assert response.status_code == status, response.content
    body: dict[str, Any] = response.json()
    assert set(body) == {"detail", "errors", "field", "code", "error_class"}, body
    assert body["code"] in CODES and body["error_class"] in ERROR_CLASS_CODES and body["detail"]
    return body


# ---- the REST API, /api/v1/ -----------------------------------------------------------


def test_the_rest_api_names_the_code_of_each_typical_refusal(run: Run, key: Any, api: Api, settings: Any) -> None:
    assert refusal(Client().get(f"/api/v1/runs/{run.pk}"), 401)["code"] == "unauthenticated"
    reader = Api(make_key(run, actions=["read"])[1])
    assert refusal(reader.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj()]}), 403)["code"] == "not_allowed"
    assert refusal(api.get("/runs/987654"), 404)["code"] == "not_found"
    AgentSession.objects.create(run=run, name="empty", api_key=key[0])
    finish = refusal(api.post(f"/runs/{run.pk}/sessions/empty/finish", {"reward": 1}), 409)
    assert (finish["code"], finish["error_class"]) == ("session_rejected", "conflict")  # the class's own code, its error class's
    assert refusal(api.post(f"/runs/{run.pk}/trajectories", raw=b'{"trajectories": ['), 400)["code"] == "malformed_json"
    bad = refusal(api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj(key="")]}), 422)
    assert (bad["code"], bad["field"]) == ("invalid_input", "trajectories.0.key") and "trajectories.0.key" in bad["errors"]
    settings.RFT_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    big = api.post(f"/runs/{run.pk}/trajectories", {"trajectories": [traj(response="x" * 3000)]})
    assert refusal(big, 413)["code"] == "too_large"
    assert not Experience.objects.exists()


def test_over_the_rate_the_rest_api_answers_rate_limited(run: Run) -> None:
    api = Api(make_key(run, rate=1)[1])
    assert api.get("/runs").status_code == 200
    assert refusal(api.get("/runs"), 429)["code"] == "rate_limited"


def test_a_refusal_keeps_the_fields_clients_read_before_codes() -> None:
    """`detail` and `errors` are what clients read before `code` came; they stay, and `error_class` holds
    what `code` held before each class had its own (one code per status class)."""
    schema = ninja_api.get_openapi_schema()["components"]["schemas"]["Error"]
    assert {"detail", "errors", "field", "code", "error_class"} <= set(schema["properties"])
    assert {"code", "error_class", "detail"} <= set(schema["required"])


def test_the_openapi_schema_lists_every_code_and_every_error_response_uses_it() -> None:
    document = ninja_api.get_openapi_schema()
    error = document["components"]["schemas"]["Error"]["properties"]
    assert error["code"]["enum"] == list(CODES) and error["error_class"]["enum"] == list(ERROR_CLASS_CODES)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/Error", (method, path, status)


# ---- the OpenAI-compatible door, /api/v1/runs/<id>/openai/v1/ -------------------------


def openai_post(run: Run, raw_key: str | None, body: Any, path: str = "chat/completions", raw: bytes | None = None) -> Any:
    headers = {"Authorization": f"Bearer {raw_key}"} if raw_key else {}
    data = raw if raw is not None else json.dumps(body)
    return Client().post(f"/api/v1/runs/{run.pk}/openai/v1/{path}", data=data, content_type="application/json",
                         headers=headers)


def openai_refusal(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


# The door does its database work on threads of its own (apps/envapi/openai_api.py): they see
# only committed rows, so these tests commit theirs.
@pytest.mark.django_db(transaction=True)
def test_the_openai_door_names_the_code_of_each_typical_refusal(run: Run, key: Any, settings: Any) -> None:
    raw = key[1]
    assert openai_refusal(openai_post(run, None, CHAT), 401)["code"] == "invalid_api_key"
    reader = make_key(run, actions=["read"])[1]
    assert openai_refusal(openai_post(run, reader, CHAT), 403)["code"] == "permission_denied"
    other = Run.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    missing = Client().post(f"/api/v1/runs/{other + 1000}/openai/v1/chat/completions", data=json.dumps(CHAT),
                            content_type="application/json", headers={"Authorization": f"Bearer {raw}"})
    assert openai_refusal(missing, 404)["code"] == "not_found"
    assert openai_refusal(openai_post(run, raw, None, raw=b"{"), 400)["code"] == "invalid_json"
    bad = openai_refusal(openai_post(run, raw, {**CHAT, "temperature": "hot"}), 400)
    assert (bad["code"], bad["param"]) == ("invalid_value", "temperature")
    settings.RFT_MAX_BODY_BYTES = 2000  # the door's own check (the ASGI layer bounds bodies before it)
    big = openai_post(run, raw, {**CHAT, "messages": [{"role": "user", "content": "x" * 3000}]})
    assert openai_refusal(big, 413)["code"] == "request_too_large"


@pytest.mark.django_db(transaction=True)
def test_over_the_rate_the_openai_door_answers_rate_limit_exceeded(run: Run) -> None:
    raw = make_key(run, rate=1)[1]
    Client().get(f"/api/v1/runs/{run.pk}/openai/v1/models", headers={"Authorization": f"Bearer {raw}"})
    limited = Client().get(f"/api/v1/runs/{run.pk}/openai/v1/models", headers={"Authorization": f"Bearer {raw}"})
    assert openai_refusal(limited, 429)["code"] == "rate_limit_exceeded"


def test_no_two_response_schemas_of_the_api_share_a_name() -> None:
    """The OpenAPI document keys a schema by its class name: two classes of one name (the run's
    `EvaluationOut` and the blind evaluation's, round 61) left one route documented with the
    other's shape, and the live schema check failed on a correct answer. Each name one class."""
    from collections import defaultdict

    from ninja import Schema

    def subclasses(cls: type) -> list[type]:
        found: list[type] = [cls]
        direct: list[type] = type.__subclasses__(cls)
        for sub in direct:
            found += subclasses(sub)
        return found

    ninja_api.get_openapi_schema()  # every router imported
    by_name: dict[str, set[str]] = defaultdict(set)
    for cls in subclasses(Schema):
        module = cls.__module__
        if module.startswith(("apps.", "rftweb.")):
            by_name[cls.__name__].add(f"{module}.{cls.__qualname__}")
    shared = {name: sorted(where) for name, where in by_name.items() if len(where) > 1}
    assert not shared, f"schema classes sharing a name (the OpenAPI document keeps one): {shared}"
