"""Every way a person's access can narrow, told once to every web process
(apps.runs.events.access_changed_publish), whose open sockets then re-check themselves
(apps/runs/socket_access.py) and whose API event streams re-check their key:

- a run member removed, or their role changed (RunMember deleted or saved);
- an account deactivated, its staff or superuser flag taken away, or its password changed
  (which ends its other sessions: their stored password hash no longer matches);
- an account deleted;
- a logout (the session is ended first, so that the re-check finds it gone).

Connected in RunsConfig.ready().
"""

from __future__ import annotations


from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_delete, post_save, pre_save
from django.http import HttpRequest

from apps.runs.events import access_changed_publish
from apps.runs.models import RunMember

# The fields of an account whose change can take access away.
WATCHED_FIELDS = ("is_active", "is_staff", "is_superuser", "password")


def _member_changed(sender: type[RunMember], instance: RunMember, **kwargs: object) -> None:
    access_changed_publish(user_id=instance.user_id)


def _account_before_save(sender: type[User], instance: User, update_fields: frozenset[str] | None = None,
                         **kwargs: object) -> None:
    """Remember whether this save changes a watched field (one read, only for saves that may)."""
    instance._rft_access_changed = False  # type: ignore[attr-defined]
    if instance.pk is None or (update_fields is not None and not set(update_fields) & set(WATCHED_FIELDS)):
        return
    before = User.objects.filter(pk=instance.pk).values(*WATCHED_FIELDS).first()
    if before is None:
        return
    instance._rft_access_changed = any(before[f] != getattr(instance, f) for f in WATCHED_FIELDS)  # type: ignore[attr-defined]


def _account_saved(sender: type[User], instance: User, created: bool = False, **kwargs: object) -> None:
    if getattr(instance, "_rft_access_changed", False):
        access_changed_publish(user_id=instance.pk)


def _account_deleted(sender: type[User], instance: User, **kwargs: object) -> None:
    access_changed_publish(user_id=instance.pk)


def _logged_out(sender: object, request: HttpRequest, user: User | None, **kwargs: object) -> None:
    # Django's logout() sends this before it ends the session: end it now (its own flush
    # after this finds nothing left to do), so the sockets' re-check finds it gone.
    if user is None:
        return
    request.session.flush()
    access_changed_publish(user_id=user.pk)


def access_signals_connect() -> None:
    post_delete.connect(_member_changed, sender=RunMember, dispatch_uid="runs.access.member_deleted")
    post_save.connect(_member_changed, sender=RunMember, dispatch_uid="runs.access.member_saved")
    pre_save.connect(_account_before_save, sender=User, dispatch_uid="runs.access.account_before_save")
    post_save.connect(_account_saved, sender=User, dispatch_uid="runs.access.account_saved")
    post_delete.connect(_account_deleted, sender=User, dispatch_uid="runs.access.account_deleted")
    user_logged_out.connect(_logged_out, dispatch_uid="runs.access.logged_out")
