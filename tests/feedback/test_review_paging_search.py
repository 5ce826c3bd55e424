"""Pages and a text search on the review page and the experience browser (issue 45 item 4):
114 labels were one 9,248 px page, and nothing searched prompts, completions or comments.
Every count on the pages is checked against the rows themselves."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.feedback.review.selectors import REVIEW_PAGE_SIZE
from apps.feedback.kinds.rating import feedback_rate
from apps.runs.models import Run
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db

NEEDLE = "Carrot"  # in some comments, some prompts and some completions, in any case


def label_ids(html: str) -> list[int]:
    section = re.search(r'<section id="labels".*?</section>', html, re.S)
    assert section, "no label list on the page"
    return [int(n) for n in re.findall(r'<li class="review-row[^"]*" id="label-(\d+)"', section.group(0))]


def link(html: str, css_class: str) -> str | None:
    found = re.search(rf'<a class="{css_class}" href="([^"]+)"', html)
    return found.group(1).replace("&amp;", "&") if found else None


def labelled_run(owner: User, labels: int = 114) -> tuple[Run, list[Feedback]]:
    """A run with `labels` ratings by one annotator, one per completion; every seventh comment
    says the needle, every eleventh prompt and every thirteenth completion hold it."""
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="paged")
    annie = make_user("annie")
    add_member(run, annie)
    exps = make_experiences(run, groups=labels // 2 + 1, group_size=2, status="pending")[:labels]
    for i, e in enumerate(exps):
        Experience.objects.filter(pk=e.pk).update(
            prompt_text=f"What is {i} + 1? {'(a carrot question)' if i % 11 == 0 else ''}",
            response_text=f"<answer>{i + 1}</answer>{' CARROTS' if i % 13 == 0 else ''}")
    rows = [feedback_rate(run=run, experience=e, score=1 + i % 5, author=annie,
                          comment=f"about the {NEEDLE.lower()}" if i % 7 == 0 else "fine")
            for i, e in enumerate(exps)]
    return run, rows


def test_the_review_page_shows_labels_a_page_at_a_time_with_plain_links(owner: User) -> None:
    run, rows = labelled_run(owner)
    client = Client()
    client.force_login(owner)
    newest_first = [f.pk for f in sorted(rows, key=lambda f: (f.created_at, f.pk), reverse=True)]
    seen: list[int] = []
    url: str | None = f"/runs/{run.pk}/review/"
    pages = 0
    while url:
        html = client.get(url if url.startswith("/") else f"/runs/{run.pk}/review/{url}").content.decode()
        ids = label_ids(html)
        assert 0 < len(ids) <= REVIEW_PAGE_SIZE
        seen += ids
        pages += 1
        assert f"page {pages} of 6" in html
        assert f"{len(rows)} labels" in html
        url = link(html, "older")
    assert seen == newest_first and pages == -(-len(rows) // REVIEW_PAGE_SIZE) == 6
    # Accepting a label on page 3 comes back to page 3 (a plain form, no JavaScript).
    third = client.get(f"/runs/{run.pk}/review/?page=3").content.decode()
    target = label_ids(third)[0]
    back = client.post(f"/runs/{run.pk}/review/labels/{target}/accept/", {"page": "3"})
    assert back.status_code == 302 and parse_qs(urlsplit(back["Location"]).query)["page"] == ["3"]
    # A page number that is not one is refused naming it.
    bad = client.get(f"/runs/{run.pk}/review/?page=two")
    assert bad.status_code == 400 and "is not a page number" in bad.content.decode()


def test_the_review_page_searches_comments_prompts_and_completions_and_keeps_the_search_in_its_links(
        owner: User) -> None:
    run, rows = labelled_run(owner)
    client = Client()
    client.force_login(owner)
    needle = NEEDLE.lower()
    texts = {e.pk: f"{e.prompt_text} {e.response_text}".lower() for e in Experience.objects.filter(run=run)}
    matching = [f for f in rows if needle in f.comment.lower() or needle in texts[f.experience_id or 0]]
    assert 30 < len(matching) < len(rows)  # the three sources together, more than a page
    html = client.get(f"/runs/{run.pk}/review/?q={NEEDLE}").content.decode()
    assert f"{len(matching)} labels matching “{NEEDLE}”" in html
    older = link(html, "older")
    assert older is not None and parse_qs(urlsplit(older).query) == {"q": [NEEDLE], "page": ["2"]}
    second = client.get(f"/runs/{run.pk}/review/{older}").content.decode()
    shown = label_ids(html) + label_ids(second)
    assert sorted(shown) == sorted(f.pk for f in matching)
    assert parse_qs(urlsplit(link(second, "newer") or "").query) == {"q": [NEEDLE]}
    # The search is in every accept/reject form, so a decision keeps it.
    assert f'name="q" value="{NEEDLE}"' in second
    nothing = client.get(f"/runs/{run.pk}/review/?q=%3Cscript%3E").content.decode()
    assert "No labels" in nothing and "<script>" not in nothing and "&lt;script&gt;" in nothing


def test_the_experience_browser_searches_text_and_keeps_it_in_the_older_link(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="searched")
    exps = make_experiences(run, groups=65, group_size=2, status="pending")
    for i, e in enumerate(exps):
        Experience.objects.filter(pk=e.pk).update(
            prompt_text=f"What is {i} + 1?{' A carrot?' if i % 2 == 0 else ''}",
            response_text=f"<answer>{i + 1}</answer>{' CARROTS' if i % 5 == 0 else ''}")
    commented = {e.pk for e in exps[1:40:6]}
    for pk in commented:
        feedback_rate(run=run, experience=pk, score=3, author=owner, comment=f"the {NEEDLE} one")
    client = Client()
    client.force_login(owner)
    needle = NEEDLE.lower()
    expected = sorted((e.pk for e in Experience.objects.filter(run=run)
                       if needle in e.prompt_text.lower() or needle in e.response_text.lower() or e.pk in commented),
                      reverse=True)
    assert 50 < len(expected) < len(exps)
    html = client.get(f"/runs/{run.pk}/experiences/?q={NEEDLE}").content.decode()
    ids = [int(n) for n in re.findall(r'<tr class="experience" data-id="(\d+)"', html)]
    assert ids == expected[:50]
    assert f"50 shown of {len(expected)} matching “{NEEDLE}”" in html
    older = link(html, "more")
    assert older is not None and parse_qs(urlsplit(older).query)["q"] == [NEEDLE]
    rest = client.get(f"/runs/{run.pk}/experiences/{older}").content.decode()
    assert [int(n) for n in re.findall(r'<tr class="experience" data-id="(\d+)"', rest)] == expected[50:100]
    newest = link(rest, "newest")
    assert newest is not None and parse_qs(urlsplit(newest).query) == {"q": [NEEDLE]}
