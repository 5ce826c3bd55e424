"""Run access for the pages: the one place a view turns a URL's run id into the run and the
user's role (the REST API's counterpart is apps.runs.api_kit.run_reachable).

A run the user may not see answers 404 exactly like a missing one, so run ids cannot be
probed; a role short of what the view needs is PermissionDenied (403) naming why.
"""

from __future__ import annotations

from typing import Literal

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404

from apps.runs.models import Run
from apps.runs.selectors import run_role

# view: any role; annotate: owners and annotators (viewers only look); owner: owners and staff.
Need = Literal["view", "annotate", "owner"]
_ENOUGH: dict[str, tuple[str, ...] | None] = {"view": None, "annotate": ("owner", "annotator"), "owner": ("owner",)}
_REFUSAL = {"annotate": "viewers of a run cannot give feedback", "owner": "only the run's owner or staff may do this"}


def run_for_page(*, user: AbstractBaseUser | AnonymousUser, run_id: int, need: Need = "view",
                 runs: QuerySet[Run] | None = None) -> tuple[Run, str]:
    """The run `run_id` (from `runs`, default every run) and `user`'s role on it."""
    run = get_object_or_404(Run.objects.all() if runs is None else runs, pk=run_id)
    role = run_role(run=run, user=user)
    if role is None:
        raise Http404("no such run")
    enough = _ENOUGH[need]
    if enough is not None and role not in enough:
        raise PermissionDenied(_REFUSAL[need])
    return run, role
