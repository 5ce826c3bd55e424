"""The request the views see: Django's, with the `htmx` details that django-htmx's
middleware sets on every request (its documented typing pattern); and the browser views'
two shared answers: a fragment (alone for htmx, inside a page otherwise) and a refusal
(the one place a browser view turns kernel.exceptions' RftError into its answer)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar, cast

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django_htmx.middleware import HtmxDetails

from kernel.exceptions import RftError


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def signed_in(request: HttpRequest) -> User:
    """The person behind a login_required view (an anonymous one never gets that far: refused
    as unauthorised should it ever happen)."""
    if not isinstance(request.user, User):
        raise PermissionDenied("sign in first")
    return request.user


# ---- a fragment, or the fragment inside a page ------------------------------------------


def fragment(request: HtmxHttpRequest, template: str, context: dict[str, object], *,
             page: str = "runs/partial_page.html", status: int = 200, htmx_status: int | None = None) -> HttpResponse:
    """An htmx request gets `template` alone; a plain one (no JavaScript, a link opened in a
    tab) the same fragment inside `page`, a page template that includes `fragment` (the run
    pages' runs/partial_page.html titles it with the context's `page_title`). `htmx_status`,
    where the fragment answers htmx with another status than the page (htmx swaps only 2xx
    by default, so a fragment that shows its own error answers 200)."""
    if request.htmx:
        return render(request, template, context, status=status if htmx_status is None else htmx_status)
    return render(request, page, {**context, "fragment": template}, status=status)


# ---- refusals -----------------------------------------------------------------------------

# How a view's page shows a refusal: called with the request, the error and the view's own
# arguments (the URL's: run_id, …), it answers as the view would have.
Show = Callable[..., HttpResponseBase]
View = TypeVar("View", bound=Callable[..., HttpResponseBase])


def refusals(show: Show) -> Callable[[View], View]:
    """The browser views' one translation of the error base (the API's is rftweb/api.py
    `_on_rft_error`): the view and the services it calls raise RftError, and `show` renders
    it the way the view's page shows a refusal (plain text for a script, the fragment with its
    message for htmx, the page or a redirect with a message otherwise). A form's field errors
    stay in the view, on the form (rftweb.exceptions.form_errors_add). Nothing is written by
    a refusal (kernel.exceptions), so answering it here, after the view, changes nothing."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def refusing(request: HtmxHttpRequest, *args: object, **kwargs: object) -> HttpResponseBase:
            try:
                return view(request, *args, **kwargs)
            except RftError as exc:
                return show(request, exc, *args, **kwargs)

        return cast(View, refusing)

    return decorate


def refused_as_text(request: HtmxHttpRequest, error: RftError, *args: object, **kwargs: object) -> HttpResponse:
    """Plain text naming the problem, at the error's status (the page's script shows it)."""
    return HttpResponse(error.message, status=error.status, content_type="text/plain; charset=utf-8")


def refused_as_404(request: HtmxHttpRequest, error: RftError, *args: object, **kwargs: object) -> HttpResponse:
    """Django's 404 page, whatever the refusal: a thing one may not act on is one one cannot see."""
    raise Http404(str(error)) from None


def not_found_first(show: Show) -> Show:
    """`show`, but for a NotFound: Django's 404 page, as for any object one cannot see."""

    @functools.wraps(show)
    def showing(request: HtmxHttpRequest, error: RftError, *args: object, **kwargs: object) -> HttpResponseBase:
        if error.status == 404:
            raise Http404(error.message) from None
        return show(request, error, *args, **kwargs)

    return showing


def refused_back_to(to: Callable[..., str], *, prefix: str = "") -> Show:
    """A plain form's refusal: the message (after `prefix`) on the next page, and back to
    `to(request, *view args)`'s URL."""

    def showing(request: HtmxHttpRequest, error: RftError, *args: object, **kwargs: object) -> HttpResponseBase:
        messages.error(request, f"{prefix}{error.message}")
        return redirect(to(request, *args, **kwargs))

    return showing
