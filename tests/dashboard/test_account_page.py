"""A person's own account page (issue 45 item 1): the demo's people had no email address and
no page to set one, while /notifications/ said run-end email was on and the notify task sent
nothing. Now the header's name opens the account page (email, password, API keys), and every
place that says an email is on warns when it cannot be delivered."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from playwright.sync_api import expect

from apps.control.notifications import run_end_notify
from apps.envapi.services import api_key_create
from apps.runs.models import Run
from apps.runs.services import run_transition
from tests.factories import add_member, make_run, make_user
from tests.servers import BROWSER_WAIT_MS

PASSWORD = "pw-for-tests-only"
WARNING = "No email address set — add one on"


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width", [390, 1280])
def test_a_person_sets_their_email_on_the_account_page_and_the_run_end_email_reaches_it(
        browser: Any, live_url: str, width: int) -> None:
    owner = make_user("olga")
    run = make_run(owner=owner, name="math tutor")
    add_member(run, make_user("bo"))
    key, _ = api_key_create(name="grader env", runs=[run], actions=["read", "submit"], created_by=owner)
    api_key_create(name="someone else's", runs=[run], actions=["read"], created_by=make_user("eve"))
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    try:
        page = context.new_page()
        page.set_default_timeout(BROWSER_WAIT_MS)
        page.goto("/login/")
        page.fill("#id_username", "olga")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url("**/runs/")
        # Email is on for her own run, and nothing can carry it: the page says so.
        page.goto("/notifications/")
        expect(page.locator("#email-warning")).to_be_visible()
        expect(page.locator("#email-warning")).to_contain_text(WARNING)
        expect(page.locator(f"tr[data-run='{run.pk}'] .undeliverable")).to_be_visible()
        # The header's name opens her account page.
        page.click("header a.account-link")
        page.wait_for_url("**/account/")
        expect(page.locator("#email-warning")).to_be_visible()
        rows = page.locator("#my-keys tbody tr")
        expect(rows).to_have_count(1)  # her key, not Eve's
        expect(rows.first).to_contain_text("grader env")
        expect(rows.first).to_contain_text(f"rft_{key.prefix}_")
        expect(rows.first).to_contain_text("math tutor")
        page.fill("#id_email", "olga@example")  # the browser takes it; a server refuses an address with no domain
        page.click("#account-email button[type=submit]")
        expect(page.locator("#error_email")).to_contain_text("is not an email address")
        page.fill("#id_email", "olga@example.org")
        page.click("#account-email button[type=submit]")
        page.wait_for_url("**/account/")
        expect(page.locator(".messages")).to_contain_text("olga@example.org")
        expect(page.locator("#email-warning")).to_have_count(0)
        page.goto("/notifications/")
        expect(page.locator("h1")).to_have_text("Notifications")
        expect(page.locator("#email-warning")).to_have_count(0)
        assert page.locator(".undeliverable").count() == 0
        assert page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth") <= 0
    finally:
        context.close()
    # The run's end now reaches her.
    mail.outbox.clear()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run_transition(run=run, action="fail", reason="train step 3 RuntimeError")
    assert run_end_notify(run_id=run.pk, audit_id=run.audit.get(action="fail").pk) == 1
    assert [m.to for m in mail.outbox] == [["olga@example.org"]]


@pytest.mark.django_db
def test_turning_email_on_without_an_address_warns_where_it_was_turned_on(client: Client) -> None:
    bo = make_user("bo")
    run = make_run(owner=make_user("olga"))
    add_member(run, bo)
    client.force_login(bo)
    page = client.post(f"/notifications/runs/{run.pk}/email/", {"email": "on"}, follow=True).content.decode()
    assert WARNING in page and "until then this email is not sent" in page
    assert 'class="warning undeliverable"' in page
    bo.email = "bo@example.org"
    bo.save()
    page = client.post(f"/notifications/runs/{run.pk}/email/", {"email": "on"}, follow=True).content.decode()
    assert WARNING not in page


@pytest.mark.django_db
def test_a_person_changes_their_password_from_the_account_page(client: Client) -> None:
    make_user("olga")
    assert client.login(username="olga", password=PASSWORD)
    account = client.get("/account/").content.decode()
    assert 'href="/account/password/"' in account
    bad = client.post("/account/password/", {"old_password": "wrong", "new_password1": "a new long passphrase",
                                             "new_password2": "a new long passphrase"})
    assert bad.status_code == 200 and "field-error" in bad.content.decode()
    done = client.post("/account/password/", {"old_password": PASSWORD, "new_password1": "a new long passphrase",
                                              "new_password2": "a new long passphrase"}, follow=True)
    assert "Password changed" in done.content.decode()
    client.logout()
    assert client.login(username="olga", password="a new long passphrase")


@pytest.mark.django_db
def test_an_email_that_cannot_be_sent_is_logged_not_dropped_silently(caplog: pytest.LogCaptureFixture) -> None:
    olga = make_user("olga")
    run = make_run(owner=olga, name="math tutor")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    run_transition(run=run, action="fail", reason="train step 3 RuntimeError")
    with caplog.at_level("WARNING", logger="apps.control.notifications"):
        assert run_end_notify(run_id=run.pk, audit_id=run.audit.get(action="fail").pk) == 0
    assert "no email to olga, who has no email address set" in caplog.text
    assert mail.outbox == []
