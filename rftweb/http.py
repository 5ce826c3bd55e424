"""The request the views see: Django's, with the `htmx` details that django-htmx's
middleware sets on every request (its documented typing pattern)."""

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails
