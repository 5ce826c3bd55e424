"""A config diff between two runs (issue 32 item 5, from Weights & Biases): only the keys
that differ, as dotted paths with both values; a run one may not see is a 404 either side."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.runs.models import Run
from apps.runs.selectors import config_differences
from kernel.jsontypes import JSON
from tests.factories import add_member, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


def signed_in(client: Client, user: User) -> Client:
    client.force_login(user)
    return client


def differing_paths(html: str) -> dict[str, tuple[str, str]]:
    rows = re.findall(r'<tr data-path="([^"]+)"><th scope="row" class="key">.*?</th>\s*<td class="left"[^>]*>(.*?)</td>\s*'
                      r'<td class="right"[^>]*>(.*?)</td>',
                      html, re.S)
    return {path: (re.sub(r"<[^>]+>", "", left), re.sub(r"<[^>]+>", "", right)) for path, left, right in rows}


@pytest.fixture
def two_runs(owner: User) -> tuple[Run, Run]:
    taskset = make_taskset(owner=owner)
    first = make_run(owner=owner, taskset=taskset, name="lr 1e-5", trainer={"learning_rate": 1e-5},
                     feedback={"mode": "blend", "guidelines": "be <b>kind</b>"})
    second = make_run(owner=owner, taskset=taskset, name="lr 3e-5", trainer={"learning_rate": 3e-5}, feedback={"mode": "auto"})
    return first, second


def test_the_diff_shows_only_the_keys_that_differ_with_both_values(
        client: Client, owner: User, two_runs: tuple[Run, Run]) -> None:
    first, second = two_runs
    html = signed_in(client, owner).get(f"/runs/{first.pk}/diff/{second.pk}/").content.decode()
    diff = differing_paths(html)
    assert diff["trainer.learning_rate"] == ("1e-05", "3e-05")
    assert diff["feedback.mode"] == ('&quot;blend&quot;', '&quot;auto&quot;')
    # Model-written text (guidelines) is escaped.
    assert "feedback.guidelines" in diff and "&lt;b&gt;kind&lt;/b&gt;" in diff["feedback.guidelines"][0]
    assert "<b>kind</b>" not in html
    # Keys both runs share with the same value are left out.
    assert "algorithm" not in diff and "total_steps" not in diff and "model" not in diff
    # The run page's picker sends ?with=: the same page.
    assert differing_paths(client.get(f"/runs/{first.pk}/diff/?with={second.pk}").content.decode()) == diff


def test_the_run_page_links_to_the_diff_and_the_diff_page_offers_the_other_runs(
        client: Client, owner: User, two_runs: tuple[Run, Run]) -> None:
    first, second = two_runs
    c = signed_in(client, owner)
    assert f'href="/runs/{first.pk}/diff/"' in c.get(f"/runs/{first.pk}/").content.decode()
    picker = c.get(f"/runs/{first.pk}/diff/")
    assert picker.status_code == 200
    assert re.search(rf'<option value="{second.pk}"[^>]*>lr 3e-5 #{second.pk}', picker.content.decode())
    same = c.get(f"/runs/{first.pk}/diff/{first.pk}/").content.decode()
    assert 'id="diff-same"' in same


def test_a_run_the_person_cannot_see_is_not_found_on_either_side(
        client: Client, owner: User, two_runs: tuple[Run, Run]) -> None:
    first, _ = two_runs
    stranger = make_user("stranger")
    theirs = make_run(owner=stranger, taskset=make_taskset(owner=stranger, name="theirs"), name="private")
    c = signed_in(client, owner)
    assert c.get(f"/runs/{first.pk}/diff/{theirs.pk}/").status_code == 404
    assert c.get(f"/runs/{first.pk}/diff/?with={theirs.pk}").status_code == 404
    assert c.get(f"/runs/{first.pk}/diff/?with=999999").status_code == 404
    assert "private" not in c.get(f"/runs/{first.pk}/diff/").content.decode()  # not offered either
    assert signed_in(client, stranger).get(f"/runs/{first.pk}/diff/{theirs.pk}/").status_code == 404
    # An annotator of both runs may compare them.
    annie = make_user("annie")
    add_member(first, annie)
    add_member(theirs, annie)
    assert signed_in(client, annie).get(f"/runs/{first.pk}/diff/{theirs.pk}/").status_code == 200


def test_a_with_that_is_not_a_number_is_a_clear_400(client: Client, owner: User, two_runs: tuple[Run, Run]) -> None:
    first, _ = two_runs
    for junk in ("²", "１２", "9" * 40, "-3", " "):
        assert signed_in(client, owner).get(f"/runs/{first.pk}/diff/", {"with": junk}).status_code == 400, junk
    assert client.get(f"/runs/{first.pk}/diff/", {"with": "9" * 18}).status_code == 404
    assert client.get(f"/runs/{first.pk}/diff/{'9' * 40}/").status_code == 404
    response = client.get(f"/runs/{first.pk}/diff/?with=<x>")
    assert response.status_code == 400
    assert "“with” must be a run number" in response.content.decode() and "<x>" not in response.content.decode()


def test_nested_keys_flatten_to_dotted_paths_and_lists_compare_whole() -> None:
    left: JSON = {"a": {"b": {"c": 1}, "d": [1, 2]}, "e": True, "gone": 1}
    right: JSON = {"a": {"b": {"c": 2}, "d": [1, 2]}, "e": 1, "new": {"x": None}}
    assert [(d["path"], d["left"], d["right"], d["only"]) for d in config_differences(left, right)] == [
        ("a.b.c", "1", "2", ""), ("e", "true", "1", ""), ("gone", "1", "", "left"), ("new.x", "", "null", "right"),
    ]
