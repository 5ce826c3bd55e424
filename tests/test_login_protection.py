"""Password guessing is throttled without locking the owner out (issue 49; django-axes through
rftweb/login_guard.py): ten wrong passwords for a username from one address pause that
username from that address only; fifty from one address (any usernames) pause that address;
the person with the right password from an address that has not failed logs in, during the
guesser's lock; the forgotten-password path stays open and clears the count; every failure
and every lock is audited. The address is the peer's unless a proxy named in
FORWARDED_ALLOW_IPS reports it (tests/test_request_guard.py covers the header)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from axes.models import AccessAttempt, AccessFailureLog
from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.test import Client
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from tests.factories import make_user

pytestmark = pytest.mark.django_db

RIGHT = "pw-for-tests-only"
PAUSED = "Too many failed logins from your address"
GUESSER = "203.0.113.66"


def attempt(client: Client, username: str, password: str, *, path: str = "/login/", address: str = "127.0.0.1") -> Any:
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def guess(username: str, times: int, *, address: str = GUESSER, path: str = "/login/") -> Any:
    client, answer = Client(), None
    for i in range(times):
        answer = attempt(client, username, f"guess-{i}", address=address, path=path)
    return answer


def test_a_guesser_locks_only_themselves_out_and_the_owner_logs_in_during_their_lock(owner: User, annotator: User) -> None:
    for i in range(9):
        answer = attempt(Client(), "owner", f"guess-{i}", address=GUESSER)
        assert answer.status_code == 200 and b"Please enter a correct username and password" in answer.content
    locked = attempt(Client(), "owner", "guess-9", address=GUESSER)
    assert locked.status_code == 429 and PAUSED in locked.content.decode()
    assert int(locked["Retry-After"]) == 900
    # The guesser's right guess is refused too: they are paused, whatever they send.
    assert attempt(Client(), "owner", RIGHT, address=GUESSER).status_code == 429

    # The owner, from their own address (which has not failed), logs in at once.
    mine = Client()
    assert attempt(mine, "owner", RIGHT, address="198.51.100.7").status_code == 302
    assert mine.get("/runs/").status_code == 200
    # Another username from the guesser's address is not paused by this username's lock.
    assert attempt(Client(), "annotator", RIGHT, address=GUESSER).status_code == 302

    # Audited: the pair's count, each failure, and the lock itself.
    assert AccessAttempt.objects.get(username="owner", ip_address=GUESSER).failures_since_start >= 10
    assert AccessFailureLog.objects.filter(username="owner", ip_address=GUESSER).count() >= 10
    assert AccessFailureLog.objects.filter(username="owner", ip_address=GUESSER, locked_out=True).exists()


def test_an_address_spraying_many_usernames_is_paused_and_others_are_not(owner: User, annotator: User,
                                                                         settings: Any) -> None:
    settings.RFT_LOGIN_ADDRESS_FAILURE_LIMIT = 12
    for i in range(12):
        attempt(Client(), f"nobody-{i}", "guess", address=GUESSER)  # one try each: no username reaches 10
    paused = attempt(Client(), "annotator", RIGHT, address=GUESSER)
    assert paused.status_code == 429 and PAUSED in paused.content.decode()
    elsewhere = Client()
    assert attempt(elsewhere, "annotator", RIGHT, address="10.0.0.8").status_code == 302
    assert elsewhere.get("/runs/").status_code == 200


def test_a_sprayer_cannot_clear_the_address_count_by_logging_into_their_own_account(owner: User, settings: Any) -> None:
    settings.RFT_LOGIN_ADDRESS_FAILURE_LIMIT = 12
    make_user("mallory")
    for i in range(11):
        attempt(Client(), f"nobody-{i}", "guess", address=GUESSER)
    assert attempt(Client(), "mallory", RIGHT, address=GUESSER).status_code == 302
    attempt(Client(), "nobody-x", "guess", address=GUESSER)
    assert attempt(Client(), "owner", RIGHT, address=GUESSER).status_code == 429


def test_the_forgotten_password_path_stays_open_and_clears_the_count(owner: User) -> None:
    me = "192.0.2.10"
    guess("owner", 10, address=me)  # the owner forgot it, from their own address
    assert attempt(Client(), "owner", RIGHT, address=me).status_code == 429
    client = Client(REMOTE_ADDR=me)
    assert client.get("/password/reset/").status_code == 200
    assert client.post("/password/reset/", {"email": "owner@example.com"}).status_code == 302
    uid = urlsafe_base64_encode(force_bytes(owner.pk))
    form = client.get(f"/password/reset/{uid}/{default_token_generator.make_token(owner)}/", follow=True)
    assert form.status_code == 200
    done = client.post(form.redirect_chain[-1][0], {"new_password1": "a-new-long-password",
                                                    "new_password2": "a-new-long-password"})
    assert done.status_code == 302
    assert attempt(Client(), "owner", "a-new-long-password", address=me).status_code == 302


def test_the_admin_login_pauses_with_the_same_message() -> None:
    make_user("root", staff=True)
    refused = guess("root", 11, path="/admin/login/")
    assert refused.status_code == 429 and PAUSED in refused.content.decode()
    assert attempt(Client(), "root", RIGHT, path="/admin/login/", address=GUESSER).status_code == 429
    # The site's login page from another address lets root in.
    assert attempt(Client(), "root", RIGHT, address="10.0.0.9").status_code == 302


def test_the_pause_ends_after_the_configured_time_and_a_success_resets_the_count(owner: User, settings: Any) -> None:
    from datetime import timedelta

    settings.AXES_COOLOFF_TIME = timedelta(seconds=1)
    guess("owner", 10)
    assert attempt(Client(), "owner", RIGHT, address=GUESSER).status_code == 429
    time.sleep(1.5)
    assert attempt(Client(), "owner", RIGHT, address=GUESSER).status_code == 302
    # Nine more wrong ones after a success do not pause: the count started again.
    for i in range(9):
        assert attempt(Client(), "owner", f"again-{i}", address=GUESSER).status_code == 200
