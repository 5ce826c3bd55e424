"""The annotator's doors, one request each, in process: SQL statements and CPU milliseconds
per door (issue #49 item 5) with a team's state in the database: `--runs` runs each with
`--groups` groups of 4 completions, `--people` annotators on every run, and a label from
each of them already on the measured run. Every person walks bench/web_load's annotator path
once, through Django's test client (the whole middleware chain, the templates, the context
processors): the login form and its POST, the annotation page (its first load: the queue's
hand-out), the header's counts, a rating's POST, the counts again, the queue's top-up (the
next items), a group's ranking form and its POST.

CPU is the process's own (time.process_time: the Python of the request, the database's
share excluded), so a host's load inflates it less than wall time; the load average is
printed beside every figure all the same. Statements are counted exactly (the same for every
person: a count that differs between them is printed as a range). The login POST checks a
password hash: its CPU is the hasher's (PBKDF2 at Django's iterations) unless
RFT_FAST_PASSWORD_HASHER is set.

    python -m bench door_costs [--people 30] [--runs 3] [--groups 75] [--walkers 12] [--profile DOOR]

tests/test_door_costs.py pins the statements per door with a ceiling.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.common import BENCH_DB, median, scratch_database

PASSWORD = "bench-door-costs-password"
HTMX = {"HX-Request": "true"}
CSRF_INPUT = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
ITEM = re.compile(r'data-assignment="(\d+)" data-experience="(\d+)"')
RANK_FIELD = re.compile(r'name="rank_(\d+)"')

# The annotator's doors, in the order a person meets them (bench/web_load's annotator).
DOORS = ("GET login", "POST login", "GET annotate page", "GET counts", "POST rate", "GET queue", "GET rank", "POST rank")


def load_average() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Team:
    """The state the doors are measured against: the measured run, its annotators (each with
    one label on it), the other runs beside it."""

    run_id: int
    people: list[str]
    other_runs: list[int] = field(default_factory=list)


def team_build(*, people: int = 30, runs: int = 3, groups: int = 75, group_size: int = 4,
               password: str = PASSWORD, prefix: str = "door") -> Team:
    """`runs` runs of `groups` pending groups each, `people` annotators on all of them, and a
    rating by each annotator on the first run (labels, late counts, the ledger have rows)."""
    from django.contrib.auth.hashers import make_password
    from django.contrib.auth.models import User

    from apps.buffer.models import Experience
    from apps.feedback.kinds.rating import feedback_rate
    from apps.runs.models import RunMember
    from tests.factories import make_experiences, make_run

    owner = User.objects.create(username=f"{prefix}-owner", password=make_password(password))
    made = [make_run(owner=owner, name=f"{prefix} run {i}", feedback={"mode": "blend", "overlap": 2})
            for i in range(runs)]
    hashed = make_password(password)
    team = User.objects.bulk_create([User(username=f"{prefix}-annotator{i}", password=hashed) for i in range(people)])
    RunMember.objects.bulk_create([RunMember(run=r, user=u, role=RunMember.Role.ANNOTATOR) for r in made for u in team])
    for r in made:
        make_experiences(r, groups=groups, group_size=group_size, status="pending")
    # One label each, on the oldest groups (the hand-out serves the freshest first).
    oldest = list(Experience.objects.filter(run=made[0]).order_by("id").values_list("id", flat=True)[:people])
    for person, experience in zip(team, oldest):
        feedback_rate(run=made[0], experience=experience, score=3, author=person)
    return Team(run_id=made[0].pk, people=[u.username for u in team], other_runs=[r.pk for r in made[1:]])


@dataclass
class Cost:
    statements: list[int] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    sql: list[str] = field(default_factory=list)  # the first walk's statements (for --show)


Costs = dict[str, Cost]


@contextmanager
def _measured(costs: Costs, door: str, profile: cProfile.Profile | None) -> Iterator[None]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        if profile is not None:
            profile.enable()
        start = time.process_time()
        yield
        cpu = time.process_time() - start
        if profile is not None:
            profile.disable()
    cost = costs[door]
    cost.statements.append(len(queries.captured_queries))
    cost.cpu_ms.append(1000 * cpu)
    if not cost.sql:
        cost.sql = [q["sql"] for q in queries.captured_queries]


def walk(username: str, run_id: int, costs: Costs, *, password: str = PASSWORD,
         profile: dict[str, cProfile.Profile] | None = None) -> None:
    """One person through the doors (DOORS), each request measured into `costs`."""
    from django.test import Client

    client = Client()
    page_url = f"/runs/{run_id}/annotate/"

    def door(name: str, call: Callable[[], Any], expect: int = 200) -> str:
        with _measured(costs, name, (profile or {}).get(name)):
            answer = call()
        assert answer.status_code == expect, f"{name}: {answer.status_code} {answer.content[:300]!r}"
        return str(answer.content.decode())

    login = door("GET login", lambda: client.get("/login/"))
    token = CSRF_INPUT.search(login)
    door("POST login", lambda: client.post("/login/", {"username": username, "password": password, "next": page_url,
                                                      "csrfmiddlewaretoken": token.group(1) if token else ""}), 302)
    items = [(int(a), int(e)) for a, e in ITEM.findall(door("GET annotate page", lambda: client.get(page_url)))]
    assert len(items) >= 3, f"{username}'s queue holds {len(items)} items"
    door("GET counts", lambda: client.get(f"{page_url}counts/", headers=HTMX))
    door("POST rate", lambda: client.post(f"{page_url}items/{items[0][0]}/rate/", {"score": "4"}, headers=HTMX))
    door("GET counts", lambda: client.get(f"{page_url}counts/", headers=HTMX))
    door("GET queue", lambda: client.get(f"{page_url}queue/?after={items[-1][0]}", headers=HTMX))
    rank_url = f"{page_url}experiences/{items[1][1]}/rank/"
    members = RANK_FIELD.findall(door("GET rank", lambda: client.get(rank_url, headers=HTMX)))
    door("POST rank", lambda: client.post(rank_url, {f"rank_{m}": str(i + 1) for i, m in enumerate(members)}, headers=HTMX))


def costs_measure(team: Team, walkers: int, *, password: str = PASSWORD,
                  profile: dict[str, cProfile.Profile] | None = None) -> Costs:
    """`walkers` of the team's people walk the doors, one after another."""
    costs: Costs = defaultdict(Cost)
    for username in team.people[:walkers]:
        walk(username, team.run_id, costs, password=password, profile=profile)
    return costs


def _span(values: list[int]) -> str:
    return str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def costs_print(costs: Costs) -> None:
    print(f"{'door':20s} {'statements':>10s} {'CPU ms p50':>10s} {'min':>7s} {'max':>7s}  n")
    for name in DOORS:
        c = costs[name]
        print(f"{name:20s} {_span(c.statements):>10s} {median(c.cpu_ms):10.1f} {min(c.cpu_ms):7.1f} "
              f"{max(c.cpu_ms):7.1f}  {len(c.cpu_ms)}  ({load_average()})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--people", type=int, default=30, help="annotators on every run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--groups", type=int, default=75, help="groups of 4 completions per run")
    parser.add_argument("--walkers", type=int, default=12, help="people who walk the doors (one walk each)")
    parser.add_argument("--profile", action="append", default=[],
                        help="a door to profile (cProfile on process time, top 40; PROFILE_FILTER: a regex of the rows)")
    parser.add_argument("--show", action="append", default=[], help="a door whose statements to print")
    args = parser.parse_args(argv)
    db_url, drop = scratch_database(BENCH_DB, "door_costs")
    os.environ["DATABASE_URL"] = db_url
    os.environ.pop("TEST_DATABASE_NAME", None)
    os.environ.setdefault("REDIS_URL", "redis://localhost:6379/15")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    # As bench/web_load serves it: DEBUG off (the site's error pages, no debug bookkeeping),
    # plain HTTP (no TLS redirect, cookies the client sends back).
    os.environ.update({"DEBUG": "0", "SECRET_KEY": "bench-door-costs-secret-key-not-for-production-0123456789",
                       "SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0",
                       "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING")})
    try:
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        team = team_build(people=args.people, runs=args.runs, groups=args.groups)
        print(f"door_costs: {args.runs} runs x {args.groups * 4} completions, {args.people} annotators each, "
              f"{args.walkers} walks, DEBUG {settings.DEBUG}  ({load_average()})", flush=True)
        profiles = {name: cProfile.Profile(time.process_time) for name in args.profile}
        costs = costs_measure(team, min(args.walkers, args.people), profile=profiles)
        costs_print(costs)
        for name in args.show:
            print(f"--- {name}: {len(costs[name].sql)} statements")
            for sql in costs[name].sql:
                print("   ", sql[:220])
        for name, prof in profiles.items():
            print(f"--- profile of {name} ({len(costs[name].cpu_ms)} requests)")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(os.environ.get("PROFILE_FILTER", ""), 40)
        doors = ("GET annotate page", "GET queue", "POST rate", "GET counts")
        print("door_costs: the annotation doors' CPU ms p50 (page / next items / label / counts): "
              + " / ".join(f"{median(costs[d].cpu_ms):.1f}" for d in doors) + "; statements "
              + " / ".join(str(max(costs[d].statements)) for d in doors) + f"  ({load_average()})")
        return 0
    finally:
        from django.db import connections

        connections.close_all()
        drop()


if __name__ == "__main__":
    raise SystemExit(main())
