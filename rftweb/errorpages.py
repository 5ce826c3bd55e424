"""The site's own 404 and 500 pages under DEBUG too (issue 45 item 2).

`make run` serves with DEBUG on: the demo's accounts with known passwords (`rft_demo`
refuses otherwise), static files served by the app under daphne, and cookies over plain HTTP
(the production profile's secure cookies, HSTS and HTTPS redirect come on with DEBUG off)
all hang on it. Django's DEBUG also answers a missing page or an exception with its
technical pages (the URL patterns, a traceback, the settings), which a person walking the
demo should never see. This middleware answers them with the site's own pages
(templates/404.html, 500.html, Django's handlers as with DEBUG off) instead; the traceback
goes to the log as ever. A developer who wants Django's pages sets RFT_TECHNICAL_ERROR_PAGES = True
in a settings module of their own.
With DEBUG off Django renders the site's pages itself and this middleware is not loaded.

Two doors: a path no URL pattern matches (found before the view runs, so CommonMiddleware,
outside this one, still redirects `/runs` to `/runs/`), and an exception a view raises
(Http404, a bad request, any other error). An unreachable Postgres or Redis is left to
rftweb/degrade.py (503), and a permission refusal to Django, whose 403 page is the site's in
DEBUG too. An exception raised by a middleware, outside any view, still gets Django's DEBUG
page (none of ours raises one but the outage errors degrade.py answers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import BadRequest, MiddlewareNotUsed, PermissionDenied, SuspiciousOperation
from django.core.handlers.exception import get_exception_response
from django.core.signals import got_request_exception
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.urls import Resolver404, get_resolver

from rftweb.degrade import dependency_down, dependency_failed, unavailable_response

log = logging.getLogger("django.request")


class SiteErrorPagesMiddleware:
    """In DEBUG (unless RFT_TECHNICAL_ERROR_PAGES): the site's 404/400/500 pages, never
    Django's technical ones."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        if not settings.DEBUG or settings.RFT_TECHNICAL_ERROR_PAGES:
            raise MiddlewareNotUsed
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        resolver = get_resolver(getattr(request, "urlconf", None))
        try:
            resolver.resolve(request.path_info)
        except Resolver404 as exc:
            try:
                return get_exception_response(request, resolver, 404, exc)
            except Exception as failed:  # the page's header reads the session and the badge
                dependency = dependency_failed(failed)
                if dependency is None:
                    raise
                return unavailable_response(request, dependency)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        resolver = get_resolver(getattr(request, "urlconf", None))
        if isinstance(exception, Http404):
            return get_exception_response(request, resolver, 404, exception)
        if isinstance(exception, (BadRequest, SuspiciousOperation, MultiPartParserError)):
            return get_exception_response(request, resolver, 400, exception)
        if isinstance(exception, PermissionDenied) or dependency_down(exception) is not None:
            return None
        # What Django does for an uncaught exception with DEBUG off: tell the signal's
        # listeners, log it with its traceback, answer the 500 handler's page.
        got_request_exception.send(sender=None, request=request)
        log.error("Internal Server Error: %s", request.path, exc_info=exception,
                  extra={"status_code": 500, "request": request})
        response: HttpResponse = resolver.resolve_error_handler(500)(request)
        return response
