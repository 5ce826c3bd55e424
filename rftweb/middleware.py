"""Input hygiene for every form and query string (`kernel.input_checks`): a field holding text
Postgres cannot store (NUL) is refused with 400 naming the field before any view runs, so
no form handler can fail with a DataError on it. The environment API (`/api/`) parses and
checks its own JSON bodies and answers in its own error format."""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from kernel.input_checks import InputRejected, text_check
from rftweb.uploads import UploadTooLarge, upload_refused

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class FormHygieneMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/api/"):
            try:
                self._check(request)
            except InputRejected as exc:
                return HttpResponseBadRequest(f"{exc.field}: {exc.message}\n", content_type="text/plain; charset=utf-8")
            except UploadTooLarge as exc:
                return upload_refused(exc)
            except (RequestDataTooBig, TooManyFieldsSent):
                pass  # Django answers these itself when the view reads the form
        return self.get_response(request)

    @staticmethod
    def _check(request: HttpRequest) -> None:
        params = [request.GET]
        if request.method in ("POST", "PUT", "PATCH") and (request.content_type or "") in FORM_TYPES:
            params.append(request.POST)
        for query in params:
            for name, values in query.lists():
                text_check(name, field="a field name")
                for value in values:
                    text_check(value, field=name)
