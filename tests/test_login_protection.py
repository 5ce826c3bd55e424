"""Password guessing is throttled (django-axes through rftweb/login_guard.py): ten wrong
passwords lock the account and the address for the configured time, on the login page and
the admin login; the right password is refused during the lock with the same clear message;
every attempt is audited (issue #33)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from axes.models import AccessAttempt, AccessFailureLog
from django.contrib.auth.models import User
from django.test import Client

from tests.factories import make_user

pytestmark = pytest.mark.django_db

RIGHT = "pw-for-tests-only"
LOCKED = "Too many failed logins for this account or from this address (10 in a row)"


def attempt(client: Client, username: str, password: str, *, path: str = "/login/", address: str = "127.0.0.1") -> Any:
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_ten_wrong_passwords_lock_the_account_even_against_the_right_password(owner: User) -> None:
    client = Client()
    for i in range(9):
        answer = attempt(client, "owner", f"guess-{i}")
        assert answer.status_code == 200 and b"Please enter a correct username and password" in answer.content
    locked = attempt(client, "owner", "guess-9")
    assert locked.status_code == 429 and LOCKED in locked.content.decode()
    assert int(locked["Retry-After"]) == 900

    refused = attempt(client, "owner", RIGHT)
    assert refused.status_code == 429 and LOCKED in refused.content.decode()
    assert client.get("/runs/").status_code == 302  # not logged in
    # From another address the account is still locked: the lock is per account too.
    assert attempt(Client(), "owner", RIGHT, address="10.0.0.7").status_code == 429

    # Audited: one row of counts for the account, and one per failure.
    counted = AccessAttempt.objects.get(username="owner", ip_address="127.0.0.1")
    assert counted.failures_since_start >= 10
    assert AccessFailureLog.objects.filter(username="owner").count() >= 10


def test_the_address_is_locked_for_other_accounts_and_others_addresses_are_not(owner: User, annotator: User) -> None:
    for i in range(10):
        attempt(Client(), f"nobody-{i}", "guess")  # ten accounts guessed from one address
    assert LOCKED in attempt(Client(), "annotator", RIGHT).content.decode()
    elsewhere = Client()
    assert attempt(elsewhere, "annotator", RIGHT, address="10.0.0.8").status_code == 302
    assert elsewhere.get("/runs/").status_code == 200


def test_the_admin_login_locks_with_the_same_message() -> None:
    make_user("root", staff=True)
    client = Client()
    for i in range(10):
        attempt(client, "root", f"guess-{i}", path="/admin/login/")
    refused = attempt(client, "root", RIGHT, path="/admin/login/")
    assert refused.status_code == 429 and LOCKED in refused.content.decode()
    # The same account is locked on the site's login page as well.
    assert attempt(Client(), "root", RIGHT, address="10.0.0.9").status_code == 429


def test_the_lock_ends_after_the_configured_time_and_a_success_resets_the_count(owner: User, settings: Any) -> None:
    from datetime import timedelta

    settings.AXES_COOLOFF_TIME = timedelta(seconds=1)
    client = Client()
    for i in range(10):
        attempt(client, "owner", f"guess-{i}")
    assert attempt(client, "owner", RIGHT).status_code == 429
    time.sleep(1.5)
    assert attempt(client, "owner", RIGHT).status_code == 302
    # Nine more wrong ones after a success do not lock: the count started again.
    for i in range(9):
        assert attempt(Client(), "owner", f"again-{i}").status_code == 200
