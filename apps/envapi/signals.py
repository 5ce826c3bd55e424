"""A deleted account's keys are revoked with it: kept, with their maker set to NULL, they
would read as keys made by no one (a command's), which work whoever is left. Connected in
EnvapiConfig.ready()."""

from __future__ import annotations


from django.contrib.auth.models import User
from django.db.models.signals import pre_delete

from apps.envapi.services import api_keys_revoke_of


def _account_deleting(sender: type[User], instance: User, **kwargs: object) -> None:
    api_keys_revoke_of(user_id=instance.pk)


def key_signals_connect() -> None:
    pre_delete.connect(_account_deleting, sender=User, dispatch_uid="envapi.keys.account_deleting")
