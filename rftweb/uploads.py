"""A cap on each uploaded file (RFT_UPLOAD_MAX_BYTES): Django's own limits count form fields
only, and a 50 MB taskset was read and imported inside the request for 84 s (issue #33). The
handler stops reading a file at the cap; FormHygieneMiddleware (rftweb/middleware.py), which
parses every form first, answers 413 naming the field, the file and the cap."""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpResponse

from kernel.exceptions import TooLarge


class UploadTooLarge(TooLarge):
    """One uploaded file is past RFT_UPLOAD_MAX_BYTES (a 413)."""

    code = "upload_too_large"


def upload_cap_text() -> str:
    cap = settings.RFT_UPLOAD_MAX_BYTES
    return f"{cap} bytes ({cap / (1024 * 1024):.0f} MiB, RFT_UPLOAD_MAX_BYTES)" if cap >= 1024 * 1024 else f"{cap} bytes (RFT_UPLOAD_MAX_BYTES)"


class CappedUploadHandler(FileUploadHandler):
    """First of FILE_UPLOAD_HANDLERS: counts each file's bytes and refuses it at the cap;
    the default handlers after it keep the file (memory or a temporary file)."""

    received = 0

    def new_file(self, field_name: str, file_name: str, content_type: str, content_length: int | None,
                 charset: str | None = None, content_type_extra: dict[str, bytes] | None = None) -> None:
        super().new_file(field_name, file_name, content_type, content_length, charset, content_type_extra)
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > settings.RFT_UPLOAD_MAX_BYTES:
            raise UploadTooLarge(f"{self.file_name} is larger than the upload limit of {upload_cap_text()}",
                                 field=self.field_name or "file")
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handler makes the file


def upload_refused(exc: UploadTooLarge) -> HttpResponse:
    return HttpResponse(f"{exc}\n", status=413, content_type="text/plain; charset=utf-8")
