"""No crash on any input, from the browser's side: every form the pages render, filled with
junk by hypothesis and sent as the person who sees it, gets an answer below 500 (the test
client re-raises a view's exception, so a crash fails here with its traceback).

The forms are found, not listed: the owner and the annotator crawl the pages from the runs
list (links, `hx-get` partials), and every `<form>` and `hx-post` they meet is collected with
its fields (inputs, selects, textareas, named buttons), and every link with a query string
as a form of its parameters. So a form or a filter added to any page is fuzzed without a line
here. Each example runs in a savepoint rolled back afterwards, so one
example's pause, revoke or removal does not hide the next one's page; nothing it enqueues
reaches a broker (on_commit never fires).

Personas: the owner of a run with experiences, assignments, a gold item and a reward-model
version; an annotator of it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qsl, urljoin, urlsplit

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.feedback.models import Assignment
from apps.rewards.models import GoldItem, RewardModel
from apps.runs.models import Run
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

# Never sent: leaving the session, the admin site (Django's own), the API (keys, not
# sessions: schemathesis fuzzes it in tests/envapi/test_live.py). Never crawled, too: files
# (a form that downloads one, the export page's, is still sent).
SKIP = re.compile(r"^/(logout|admin|api|static)/")
NOT_PAGES = re.compile(r"\.(jsonl|json|zip|png)$|/download/|/events/")
MAX_PAGES = 120

# Values people and scripts send that a form does not expect.
JUNK = ["", " ", "\x00", "a\x00b", "-1", "0", "1", "2.5", "-0", "1e309", "-1e309", "NaN", "inf", "9" * 400,
        "x" * 20000, "<script>alert(1)</script>", "１２", "'; drop table runs; --", "None", "null", "[]", "{}",
        "true", "\ud7ff\ue000", "../../etc/passwd", "%00", "2**70", str(2**63), str(-(2**63) - 1)]
JUNK_TEXT = st.one_of(st.sampled_from(JUNK), st.text(max_size=40, alphabet=st.characters(exclude_categories=["Cs"])),
                      st.integers().map(str), st.floats(allow_nan=True, allow_infinity=True).map(str))


@dataclass
class Form:
    page: str
    action: str
    method: str
    fields: dict[str, list[str]] = field(default_factory=dict)  # name -> values the page offers
    files: set[str] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str]:
        # Forms whose actions differ only by an id are one form (each version's button, each item's rating).
        return self.method, re.sub(r"\d+", "N", urlsplit(self.action).path)


class _Page(HTMLParser):
    """Links, hx-get partials and forms (with their fields) of one page."""

    def __init__(self, url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.url = url
        self.links: set[str] = set()
        self.forms: list[Form] = []
        self._open: list[Form] = []

    def _form(self, action: str | None, method: str) -> Form:
        return Form(page=self.url, action=urljoin(self.url, action or self.url), method=method)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for attr in ("href", "hx-get"):
            if a.get(attr) and not a[attr].startswith(("#", "mailto:", "javascript:")):
                self.links.add(urljoin(self.url, a[attr]))
        if tag == "form":
            post = a.get("hx-post") or (a.get("action") if a.get("method", "get").lower() == "post" else None)
            if a.get("method", "get").lower() == "dialog":
                form = None
            elif post is not None or a.get("method", "get").lower() == "post":
                form = self._form(post or a.get("action"), "post")
            else:
                form = self._form(a.get("hx-get") or a.get("action"), "get")
            if form is not None:
                self.forms.append(form)
            self._open.append(form)  # type: ignore[arg-type]
        elif a.get("hx-post") and tag != "form":  # a button or link that posts by itself
            form = self._form(a["hx-post"], "post")
            for name, value in parse_qsl(a.get("hx-vals", "").strip("{}").replace('"', "").replace(":", "=").replace(",", "&")):
                form.fields.setdefault(name.strip(), []).append(value.strip())
            self.forms.append(form)
        if tag in ("input", "select", "textarea", "button") and a.get("name") and self._open and self._open[-1] is not None:
            form = self._open[-1]
            if a.get("type") == "file":
                form.files.add(a["name"])
            else:
                form.fields.setdefault(a["name"], []).append(a.get("value", ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._open:
            self._open.pop()


def _crawl(client: Client, start: list[str]) -> list[Form]:
    seen: set[str] = set()
    todo = list(start)
    forms: dict[tuple[str, str], Form] = {}
    while todo and len(seen) < MAX_PAGES:
        url = todo.pop(0)
        path = urlsplit(url).path
        if url in seen or SKIP.search(path) or NOT_PAGES.search(path) or urlsplit(url).netloc not in ("", "testserver"):
            continue
        seen.add(url)
        response = client.get(url)
        if response.status_code != 200 or "text/html" not in response.get("Content-Type", ""):
            continue
        page = _Page(url)
        page.feed(response.content.decode())
        for form in page.forms:
            if not SKIP.search(urlsplit(form.action).path):
                forms.setdefault(form.key, form)
        if urlsplit(url).query:  # a link's query (filters, pages, tabs): its parameters are a form too
            query = Form(page=url, action=url.split("?")[0], method="get")
            for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
                query.fields.setdefault(name, []).append(value)
            forms.setdefault((query.key[0], query.key[1] + "?" + ",".join(sorted(query.fields))), query)
        todo.extend(sorted(link.split("#")[0] for link in page.links if link.split("#")[0] not in seen))
    return list(forms.values())


@pytest.fixture
def world() -> dict[str, Any]:
    owner, annotator = make_user("owner"), make_user("annotator")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="fuzzed run",
                   feedback={"mode": "blend", "rater_weighting": "gold"}, reward_model={"enabled": True})
    add_member(run, annotator)
    experiences = make_experiences(run, groups=2, group_size=2, status="pending")
    for slot, who in enumerate((owner, annotator)):
        Assignment.objects.create(run=run, experience=experiences[slot], annotator=who, slot=slot)
    GoldItem.objects.create(run=run, experience=experiences[3], answer=1.0)
    RewardModel.objects.create(run=run, version=1, path="/nowhere/v1", base="demo", accuracy=0.9, pairs_heldout=10)
    return {"run": run, "owner": owner, "annotator": annotator}


def _start(run: Run) -> list[str]:
    return ["/runs/", "/runs/new/", f"/runs/{run.pk}/", f"/runs/{run.pk}/annotate/", f"/runs/{run.pk}/signal/raters/",
            f"/runs/{run.pk}/export/", f"/runs/{run.pk}/keys/", f"/runs/{run.pk}/signal/reward-model/",
            f"/runs/{run.pk}/diff/{run.pk}/"]


def _upload(name: str) -> Any:
    return lambda content: SimpleUploadedFile(f"{name}.yaml", content)


def _values(form: Form) -> st.SearchStrategy[dict[str, Any]]:
    """Per field: what the page offers, junk, or nothing; a file field gets junk bytes."""
    strategies: dict[str, st.SearchStrategy[Any]] = {}
    for name, offered in form.fields.items():
        strategies[name] = st.one_of(st.sampled_from(offered), JUNK_TEXT, st.none())
    for name in form.files:
        strategies[name] = st.one_of(st.none(), st.binary(max_size=300).map(_upload(name)))
    return st.fixed_dictionaries(strategies).map(lambda d: {k: v for k, v in d.items() if v is not None})


def _fuzz(client: Client, form: Form) -> Iterator[None]:
    @given(data=_values(form), htmx=st.booleans())
    @settings(max_examples=25, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def send(data: dict[str, Any], htmx: bool) -> None:
        headers = {"HX-Request": "true"} if htmx else {}
        with transaction.atomic():
            if form.method == "post":
                response = client.post(form.action, data, headers=headers)
            else:
                response = client.get(form.action, {k: v for k, v in data.items() if isinstance(v, str)}, headers=headers)
            if response.streaming:  # an export streams: a failure halfway is a crash too
                b"".join(response.streaming_content)  # type: ignore[attr-defined]
            assert response.status_code < 500, (form.method, form.action, data, response.status_code)
            transaction.set_rollback(True)

    send()
    yield


@pytest.mark.parametrize("persona", ["owner", "annotator"])
def test_every_form_a_person_sees_answers_junk_below_500(world: dict[str, Any], persona: str) -> None:
    user: User = world[persona]
    client = Client()
    client.force_login(user)
    forms = _crawl(client, _start(world["run"]))
    actions = sorted({f.key[1] for f in forms})
    # The crawl found the pages' forms (the owner more than the annotator): rating, policy,
    # members, keys, export, controls, the reward-model download...
    assert len(forms) >= (12 if persona == "owner" else 6), actions
    for form in forms:
        list(_fuzz(client, form))
