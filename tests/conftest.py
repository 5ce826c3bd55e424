from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.runs.models import Run
from tests.factories import add_member, make_run, make_taskset, make_user


@pytest.fixture
def owner(db: None) -> User:
    return make_user("owner")


@pytest.fixture
def annotator(db: None) -> User:
    return make_user("annotator")


@pytest.fixture
def outsider(db: None) -> User:
    return make_user("outsider")


@pytest.fixture
def run(owner: User, annotator: User) -> Run:
    taskset = make_taskset(owner=owner)
    run = make_run(owner=owner, taskset=taskset)
    add_member(run, annotator)
    return run
