"""Accounts without the admin site (issue 32, item 4): an owner invites people to a run by
email or a one-time link with a role, the invitee makes an account and chooses a password
through Django's password-reset machinery, and staff deactivate accounts. Django's test
client here; the one-time link in a real browser in test_pages_round2.py."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.utils import timezone

from apps.feedback.models import Feedback
from apps.runs.invitations import InvitationGone, invitation_accept, invitation_create
from apps.runs.models import AuditEntry, Invitation, Run, RunMember
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-enough-password-7"


def owner_client(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def link_in(text: str) -> str:
    match = re.search(r"http://testserver(/invite/[^/\s]+/)", text)
    assert match, text
    return match.group(1)


def join(link: str, username: str, **extra: str) -> Client:
    """A newcomer opens the link, picks a username, then a password on Django's page."""
    newcomer = Client()
    response = newcomer.post(link, {"username": username, **extra})
    assert response.status_code == 302, response.content.decode()[-1500:]
    confirm = newcomer.get(response["Location"], follow=True)  # Django moves the token into the session
    assert b"Choose your password" in confirm.content
    done = newcomer.post(confirm.redirect_chain[-1][0], {"new_password1": PASSWORD, "new_password2": PASSWORD})
    assert done.status_code == 302 and done["Location"] == "/runs/", done.content.decode()[-1500:]
    return newcomer


def test_an_email_invitation_is_sent_and_its_link_makes_an_annotator_of_that_run_only(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="team run", feedback={"mode": "blend"})
    elsewhere = make_run(owner=owner, name="elsewhere")
    response = owner_client(owner).post(f"/runs/{run.pk}/invitations/", {"email": "ada@example.org", "role": "annotator"})
    assert "Invitation sent to ada@example.org as annotator" in response.content.decode()
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["ada@example.org"]
    assert "team run" in mail.outbox[0].subject
    link = link_in(str(mail.outbox[0].body))

    ada = join(link, "ada")
    user = User.objects.get(username="ada")
    assert user.email == "ada@example.org" and user.has_usable_password()
    assert RunMember.objects.get(run=run, user=user).role == "annotator"
    # Logged in: their home page lists this run (and no other), with Annotate.
    home = ada.get("/runs/").content.decode()
    assert f'data-run="{run.pk}"' in home and f'data-run="{elsewhere.pk}"' not in home
    assert ada.get(f"/runs/{run.pk}/annotate/").status_code == 200
    assert ada.get(f"/runs/{elsewhere.pk}/").status_code == 404
    assert ada.get(f"/runs/{run.pk}/signal/raters/").status_code == 403  # the owner's page
    # The link was for one person: it is used up.
    again = Client().get(link)
    assert again.status_code == 404 and "not valid" in again.content.decode()
    assert AuditEntry.objects.filter(run=run, action="invite_used", actor=user).exists()
    # And the password works at the login page.
    assert Client().login(username="ada", password=PASSWORD)


def test_a_one_time_link_is_shown_once_and_the_account_it_makes_can_rate_that_run(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"mode": "blend"})
    experiences = make_experiences(run, groups=1, group_size=2, status="pending")
    html = owner_client(owner).post(f"/runs/{run.pk}/invitations/", {"email": "", "role": "annotator"}).content.decode()
    match = re.search(r'id="id_invite_link" type="text" readonly value="http://testserver(/invite/[^"]+/)"', html)
    assert match, html
    assert Invitation.objects.get().token_digest not in html  # only the digest is stored, never shown
    newcomer = join(match.group(1), "bea", email="bea@example.org")
    page = newcomer.get(f"/runs/{run.pk}/annotate/").content.decode()
    assignment = re.search(r'data-assignment="(\d+)"', page)
    assert assignment, page
    response = newcomer.post(f"/runs/{run.pk}/annotate/items/{assignment.group(1)}/rate/", {"score": "5"})
    assert response.status_code == 302
    assert Feedback.objects.filter(run=run, author__username="bea", experience__in=experiences).count() == 1


def test_a_viewer_invitation_gives_a_viewer_who_cannot_rate(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), feedback={"mode": "blend"})
    made = invitation_create(run=run, role="viewer", actor=owner)
    viewer = join(f"/invite/{made.token}/", "cy")
    assert RunMember.objects.get(run=run, user__username="cy").role == "viewer"
    assert viewer.get(f"/runs/{run.pk}/").status_code == 200
    assert viewer.get(f"/runs/{run.pk}/annotate/queue/?after=0").status_code == 403


def test_someone_logged_in_joins_with_their_own_account(owner: User) -> None:
    run = make_run(owner=owner, taskset=make_taskset(owner=owner))
    dan = make_user("dan")
    made = invitation_create(run=run, role="annotator", email="dan@example.org", actor=owner)
    client = Client()
    client.force_login(dan)
    assert b"Join as dan" in client.get(f"/invite/{made.token}/").content
    response = client.post(f"/invite/{made.token}/")
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert RunMember.objects.get(run=run, user=dan).role == "annotator"
    assert User.objects.count() == 2  # no second account


def test_bad_invitations_are_refused_by_name(owner: User) -> None:
    run = make_run(owner=owner)
    client = owner_client(owner)
    html = client.post(f"/runs/{run.pk}/invitations/", {"email": "not an address", "role": "annotator"}).content.decode()
    assert "is not an email address" in html
    html = client.post(f"/runs/{run.pk}/invitations/", {"email": "", "role": "boss"}).content.decode()
    assert "role must be one of: annotator, viewer" in html
    assert not Invitation.objects.exists()
    # A taken username is said beside its field, and the link still works for another name.
    made = invitation_create(run=run, role="annotator", actor=owner)
    taken = Client().post(f"/invite/{made.token}/", {"username": "owner"})
    assert taken.status_code == 400 and "is taken" in taken.content.decode()
    join(f"/invite/{made.token}/", "eve")


def test_an_expired_or_revoked_invitation_no_longer_works(owner: User) -> None:
    run = make_run(owner=owner)
    expired = invitation_create(run=run, role="annotator", actor=owner)
    Invitation.objects.filter(pk=expired.invitation.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert Client().get(f"/invite/{expired.token}/").status_code == 404
    revoked = invitation_create(run=run, role="annotator", actor=owner)
    html = owner_client(owner).get(f"/runs/{run.pk}/").content.decode()
    assert f'data-invitation="{revoked.invitation.pk}"' in html
    owner_client(owner).post(f"/runs/{run.pk}/invitations/{revoked.invitation.pk}/revoke/")
    with pytest.raises(InvitationGone):
        invitation_accept(token=revoked.token, user=make_user("late"))
    assert not RunMember.objects.filter(run=run).exists()


def test_only_the_owner_invites(owner: User) -> None:
    run = make_run(owner=owner)
    annotator = make_user("ann")
    add_member(run, annotator)
    client = Client()
    client.force_login(annotator)
    assert client.post(f"/runs/{run.pk}/invitations/", {"email": "x@example.org", "role": "annotator"}).status_code == 403
    assert not Invitation.objects.exists()


def test_a_forgotten_password_is_reset_by_email(owner: User) -> None:
    owner.email = "owner@example.org"
    owner.save()
    response = Client().post("/password/reset/", {"email": "owner@example.org"})
    assert response.status_code == 302
    link = re.search(r"http://testserver(/password/reset/\S+/)", str(mail.outbox[0].body))
    assert link, mail.outbox[0].body
    client = Client()
    confirm = client.get(link.group(1), follow=True)
    client.post(confirm.redirect_chain[-1][0], {"new_password1": PASSWORD, "new_password2": PASSWORD})
    assert Client().login(username="owner", password=PASSWORD)


def test_staff_deactivate_an_account_which_then_cannot_log_in_and_is_logged_out() -> None:
    staff = make_user("root", staff=True)
    person = make_user("frank")
    run = make_run(owner=make_user("own"), name="r")
    add_member(run, person)
    session = Client()
    session.force_login(person)
    assert session.get("/runs/").status_code == 200
    admin = Client()
    admin.force_login(staff)
    page = admin.get("/accounts/").content.decode()
    assert 'data-account="frank" data-active="1"' in page
    response = admin.post(f"/accounts/{person.pk}/active/", {"active": "0"}, follow=True)
    assert "frank is deactivated" in response.content.decode()
    assert not Client().login(username="frank", password="pw-for-tests-only")
    assert session.get("/runs/")["Location"].startswith("/login/")  # their open session ended
    # Staff cannot lock themselves out; others see no accounts page.
    admin.post(f"/accounts/{staff.pk}/active/", {"active": "0"})
    staff.refresh_from_db()
    assert staff.is_active
    other = Client()
    other.force_login(make_user("gina"))
    assert other.get("/accounts/").status_code == 302
    admin.post(f"/accounts/{person.pk}/active/", {"active": "1"})
    assert Client().login(username="frank", password="pw-for-tests-only")
    assert Run.objects.filter(pk=run.pk, members__user=person).exists()  # their membership stayed
