"""The site's URLs and two test-only views that fail (tests/test_error_pages.py): the server
those tests start names this module as its ROOT_URLCONF (tests/errorpages_settings.py)."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path

from rftweb.urls import handler500, urlpatterns as site_urlpatterns


def fails(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a test-only failure: the page must not show this")


def missing(request: HttpRequest) -> HttpResponse:
    raise Http404("a test-only missing thing: the page must not show this")


urlpatterns = [path("test-only/fails/", fails), path("test-only/missing/", missing), *site_urlpatterns]

__all__ = ["handler500", "urlpatterns"]
