"""API keys: hashed at rest, shown once, scoped, revocable; the run's key page and the admin."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.envapi.models import ApiKey
from apps.envapi.services import KeyInvalid, api_key_create, api_key_revoke
from apps.runs.models import Run
from tests.envapi.conftest import Api, make_key
from tests.factories import found, make_run, make_user

pytestmark = pytest.mark.django_db


def test_a_key_is_stored_only_as_its_hash(run: Run) -> None:
    key, raw = make_key(run)
    row = ApiKey.objects.filter(pk=key.pk).values().get()
    assert row["hashed"] == hashlib.sha256(raw.encode()).hexdigest()
    secret = raw.split("_", 2)[2]
    assert len(secret) >= 40 and not any(secret in str(v) for v in row.values())


def test_two_keys_never_share_a_secret_or_a_prefix(run: Run) -> None:
    (a, raw_a), (b, raw_b) = make_key(run), make_key(run)
    assert raw_a != raw_b and a.prefix != b.prefix


def test_a_key_with_the_right_prefix_and_a_wrong_secret_is_refused(run: Run) -> None:
    key, raw = make_key(run)
    forged = f"rft_{key.prefix}_{'A' * 43}"
    assert Api(forged).get("/runs").status_code == 401
    assert Api(raw).get("/runs").status_code == 200


def test_a_revoked_key_stops_working_on_its_next_request(run: Run) -> None:
    key, raw = make_key(run)
    api = Api(raw)
    assert api.get(f"/runs/{run.pk}").status_code == 200
    api_key_revoke(key=key)
    assert api.get(f"/runs/{run.pk}").status_code == 401


def test_a_key_and_the_runs_it_may_touch_are_read_in_one_query(run: Run, owner: User) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.envapi.services import api_key_authenticate

    other = make_run(owner=owner, name="other")
    _, raw = api_key_create(name="two", runs=[run, other], actions=["read"], rate_limit_per_minute=10)
    api_key_authenticate(raw=raw)  # records the first use
    with CaptureQueriesContext(connection) as queries:
        principal = api_key_authenticate(raw=raw)
    assert principal is not None and principal.run_ids == {run.pk, other.pk}
    assert len(queries.captured_queries) == 1


def test_a_key_whose_runs_were_all_deleted_still_authenticates_scoped_to_nothing(owner: User) -> None:
    from apps.envapi.services import api_key_authenticate

    gone = make_run(owner=owner, name="gone")
    key, raw = make_key(gone)
    gone.delete()
    principal = api_key_authenticate(raw=raw)
    assert principal is not None and principal.key.pk == key.pk and principal.run_ids == frozenset()
    api_key_revoke(key=key)
    assert api_key_authenticate(raw=raw) is None


def test_using_a_key_records_when_it_was_last_used(run: Run) -> None:
    key, raw = make_key(run)
    assert key.last_used_at is None
    Api(raw).get("/runs")
    key.refresh_from_db()
    assert key.last_used_at is not None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"actions": []}, "actions"), ({"actions": ["admin"]}, "actions"), ({"name": " "}, "name"),
     ({"rate_limit_per_minute": 0}, "rate_limit_per_minute")],
)
def test_a_key_needs_a_name_known_actions_and_a_sane_rate(run: Run, kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"name": "k", "runs": [run], "actions": ["read"], **kwargs}
    with pytest.raises(KeyInvalid) as exc:
        api_key_create(**args)
    assert field in exc.value.errors and not ApiKey.objects.exists()


# ---- the run's key page --------------------------------------------------------------


def _logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_owner_creates_a_key_that_is_shown_once_and_works(run: Run, owner: User) -> None:
    client = _logged_in(owner)
    page = client.post(f"/runs/{run.pk}/keys/", {"name": "guessing env", "actions": ["read", "submit"],
                                                 "rate_limit_per_minute": 60})
    assert page.status_code == 200 and page["Cache-Control"] == "no-store"
    raw = found(r"rft_[0-9a-f]{12}_[\w-]{40,}", page.content.decode()).group(0)
    key = ApiKey.objects.get()
    assert (key.name, key.actions, key.rate_limit_per_minute, key.created_by) == ("guessing env", ["read", "submit"], 60, owner)
    assert list(key.runs.all()) == [run]
    assert Api(raw).get(f"/runs/{run.pk}").status_code == 200
    again = client.get(f"/runs/{run.pk}/keys/").content.decode()
    assert raw not in again and f"rft_{key.prefix}_…" in again and "guessing env" in again


def test_a_key_form_with_no_action_is_refused_with_a_message(run: Run, owner: User) -> None:
    page = _logged_in(owner).post(f"/runs/{run.pk}/keys/", {"name": "x", "rate_limit_per_minute": 60})
    assert page.status_code == 422 and "This field is required" in page.content.decode()
    assert not ApiKey.objects.exists()


def test_the_owner_revokes_a_key_from_the_page(run: Run, owner: User) -> None:
    key, raw = make_key(run)
    response = _logged_in(owner).post(f"/runs/{run.pk}/keys/{key.pk}/revoke/", follow=True)
    assert "Revoked" in response.content.decode() and "revoked" in response.content.decode()
    assert Api(raw).get("/runs").status_code == 401


def test_only_the_owner_manages_keys(run: Run, annotator: User, outsider: User) -> None:
    key, raw = make_key(run)
    # The run's annotator is refused; an outsider is not told the run exists (as on every run page).
    for user, status in ((annotator, 403), (outsider, 404)):
        client = _logged_in(user)
        assert client.get(f"/runs/{run.pk}/keys/").status_code == status
        assert client.post(f"/runs/{run.pk}/keys/", {"name": "x", "actions": ["read"], "rate_limit_per_minute": 1}).status_code == status
        assert client.post(f"/runs/{run.pk}/keys/{key.pk}/revoke/").status_code == status
    assert ApiKey.objects.count() == 1 and Api(raw).get("/runs").status_code == 200
    assert Client().get(f"/runs/{run.pk}/keys/").status_code == 302


def test_a_key_of_another_run_cannot_be_revoked_through_this_runs_page(run: Run, owner: User) -> None:
    other = make_run(owner=make_user("someone"))
    key, raw = make_key(other)
    assert _logged_in(owner).post(f"/runs/{run.pk}/keys/{key.pk}/revoke/").status_code == 404
    assert Api(raw).get("/runs").status_code == 200


def test_staff_create_a_key_in_the_admin_and_see_it_once(run: Run) -> None:
    admin = make_user("admin", staff=True)
    client = _logged_in(admin)
    response = client.post("/admin/envapi/apikey/add/", {"name": "grader", "runs": [run.pk], "actions": ["feedback"],
                                                        "rate_limit_per_minute": 100}, follow=True)
    text = response.content.decode()
    raw = found(r"rft_[0-9a-f]{12}_[\w-]{40,}", text).group(0)
    key = ApiKey.objects.get()
    assert key.hashed == hashlib.sha256(raw.encode()).hexdigest() and key.actions == ["feedback"]
    assert list(key.runs.all()) == [run] and key.created_by == admin
    assert raw not in client.get(f"/admin/envapi/apikey/{key.pk}/change/").content.decode()
