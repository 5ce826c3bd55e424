"""Factories for tests: small, explicit, and every argument overridable."""

from __future__ import annotations

import itertools
import re
import threading
import uuid
from typing import Any

from django.contrib.auth.models import User

from apps.buffer.drafts import ExperienceDraft
from apps.buffer.importers import taskset_create
from apps.buffer.models import Experience, Task, Taskset
from apps.buffer.services import experience_write
from apps.runs.models import Run, RunMember
from apps.runs.services import run_create

_seq = itertools.count(1)


def make_user(username: str | None = None, *, password: str = "pw-for-tests-only", staff: bool = False) -> User:
    username = username or f"user{next(_seq)}"
    return User.objects.create_user(username=username, password=password, is_staff=staff, is_superuser=staff)


def base_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": "local/demo",
        "algorithm": "grpo",
        "mode": "sync",
        "repeat_times": 4,
        "rewards": [{"name": "exact_match"}],
    }
    config.update(overrides)
    return config


def make_taskset(n: int = 4, *, name: str = "arith", owner: User | None = None) -> Taskset:
    records = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "domain": "math"} for i in range(n)]
    return taskset_create(name=name, records=records, owner=owner)


def make_run(*, owner: User | None = None, taskset: Taskset | None = None, name: str = "run", **config: Any) -> Run:
    owner = owner or make_user()
    return run_create(name=name, owner=owner, config=base_config(**config), taskset=taskset)


def add_member(run: Run, user: User, role: str = RunMember.Role.ANNOTATOR) -> RunMember:
    return RunMember.objects.create(run=run, user=user, role=role)


def experience_row(run: Run, *, key: str | None = None, group: str | None = None, prompt_len: int = 3,
                   response_len: int = 4, **fields: Any) -> ExperienceDraft:
    """A valid experience of `run` (every field overridable): an ExperienceDraft, as every
    producer builds one."""
    values: dict[str, Any] = {
        "run_id": run.pk,
        "key": key or uuid.uuid4().hex,
        "group_id": group or uuid.uuid4().hex[:12],
        "prompt_text": "What is 1 + 1?",
        "response_text": "<answer>2</answer>",
        "token_ids": list(range(prompt_len + response_len)),
        "prompt_length": prompt_len,
        "logprobs": [-0.5] * response_len,
        "reward": 1.0,
    }
    values.update(fields)
    return ExperienceDraft.from_row(values)


def make_experiences(run: Run, *, groups: int = 2, group_size: int = 4, **fields: Any) -> list[Experience]:
    rows = []
    for g in range(groups):
        group = f"g{next(_seq)}"
        for i in range(group_size):
            rows.append(experience_row(run, key=f"{group}-{i}", group=group, **{"reward": float(i), **fields}))
    result = experience_write(experiences=rows)
    return list(Experience.objects.filter(pk__in=result.ids).order_by("id"))


def picture_png(count: int, *, seed: int = 0, colour: tuple[int, int, int] = (220, 30, 30)) -> bytes:
    """A 32×32 PNG with `count` squares (as the tiny VLM's task draws them), deterministic."""
    import random

    from workers.models.vision_demo import png_bytes, squares_image

    return png_bytes(squares_image(count=count, rng=random.Random(seed * 10 + count)))


def image_zip(path: Any, records: list[dict[str, Any]], files: dict[str, bytes]) -> Any:
    """A taskset zip: `tasks.jsonl` with `records` and the given files beside it."""
    import json
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tasks.jsonl", "\n".join(json.dumps(r) for r in records) + "\n")
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def make_image_taskset(n: int = 3, *, owner: User | None = None, name: str = "squares", tmp: Any = None,
                       file_names: list[str] | None = None) -> Taskset:
    """A vision taskset imported from a zip: task i shows i % 4 + 1 squares, domain "vision"."""
    import tempfile
    from pathlib import Path

    from apps.buffer.importers import taskset_import

    directory = Path(tmp or tempfile.mkdtemp(prefix="rft-img-"))
    names = file_names or [f"images/{i}.png" for i in range(n)]
    records = [{"prompt": "How many squares are in the image?", "answer": str(i % 4 + 1), "domain": "vision",
                "image": names[i]} for i in range(n)]
    files = {names[i]: picture_png(i % 4 + 1, seed=i) for i in range(n)}
    return taskset_import(name=name, path=image_zip(directory / "tasks.zip", records, files), owner=owner)


def found(pattern: str, text: str, flags: int = 0) -> re.Match[str]:
    """`re.search` for what a test reads off a page or a log: a miss fails the test with the
    text it searched, instead of an AttributeError on None."""
    match = re.search(pattern, text, flags)
    assert match is not None, f"{pattern!r} not found in: {text[-2000:]}"
    return match


def taskset_of(run: Run) -> Taskset:
    """The run's taskset; a test run without one fails here, by name."""
    assert run.taskset is not None, f"run {run.pk} has no taskset"
    return run.taskset


def first_task(of: Run | Taskset) -> Task:
    """The first task (by id) of a run's taskset or of a taskset."""
    task = (taskset_of(of) if isinstance(of, Run) else of).tasks.order_by("id").first()
    assert task is not None, f"{of} has no tasks"
    return task


def claims_at_once(run: Run, users: list[User], *, size: int) -> dict[str, int]:
    """Every user tops their annotation queue up to `size` at the same moment (one thread and
    database connection each, released together by a barrier); the leases each got, by name."""
    from django.db import connection

    from apps.feedback.handout.lease import assignment_claim

    barrier = threading.Barrier(len(users))
    got: dict[str, int] = {}

    def claim(user: User) -> None:
        barrier.wait()
        try:
            got[user.username] = len(assignment_claim(run=run, annotator=user, size=size))
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=claim, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got
