"""A login's password hash is derived on a lower-priority thread (rftweb/hashers.py, issue #49
item 5): the same hashes as Django's PBKDF2 hasher, checked both ways, derived on a thread whose
nice value is the caller's raised by RFT_PASSWORD_HASH_NICE, and a person logs in through the
login form with a password it stored."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest
from django.contrib.auth import hashers as django_hashers
from django.contrib.auth.hashers import PBKDF2PasswordHasher, check_password, make_password
from django.test import Client, override_settings

from rftweb.hashers import NicePBKDF2PasswordHasher
from tests.factories import make_user

NICE = ["rftweb.hashers.NicePBKDF2PasswordHasher"]
SALT = "fixedsaltforthetest"


def test_the_hash_is_djangos_pbkdf2_hash_and_each_checks_the_others() -> None:
    nice, plain = NicePBKDF2PasswordHasher(), PBKDF2PasswordHasher()
    stored = nice.encode("a password", SALT, 1000)
    assert stored == plain.encode("a password", SALT, 1000)
    assert stored.startswith("pbkdf2_sha256$1000$")
    assert plain.verify("a password", stored) and nice.verify("a password", plain.encode("a password", SALT, 1000))
    assert not nice.verify("another", stored)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_the_derivation_runs_on_a_thread_below_the_callers_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    derive = getattr(django_hashers, "pbkdf2")  # imported there from django.utils.crypto; not re-exported

    def spy(*args: Any, **kwargs: Any) -> bytes:
        thread = threading.get_native_id()
        seen.append((thread, os.getpriority(os.PRIO_PROCESS, thread)))
        return derive(*args, **kwargs)

    monkeypatch.setattr(django_hashers, "pbkdf2", spy)
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with override_settings(PASSWORD_HASHERS=NICE):
        stored = make_password("a password", SALT)
        assert check_password("a password", stored)
    assert len(seen) == 2
    for thread, nice in seen:
        assert thread != threading.get_native_id()
        assert nice == min(19, caller + 10)  # RFT_PASSWORD_HASH_NICE's default


@pytest.mark.django_db
def test_a_person_logs_in_through_the_form_with_a_password_it_stored() -> None:
    with override_settings(PASSWORD_HASHERS=NICE):
        user = make_user("hasher-person")
        user.set_password("pw-for-tests-only")
        user.save()
        assert user.password.startswith("pbkdf2_sha256$")
        answer = Client().post("/login/", {"username": "hasher-person", "password": "pw-for-tests-only"})
        assert answer.status_code == 302, answer.content[:300]
        wrong = Client().post("/login/", {"username": "hasher-person", "password": "not it"})
        assert wrong.status_code == 200
