"""Task images: checked once at import, stored once by content hash, never in Postgres.

A taskset record may carry pictures (`image`: one, `images`: a list). Each is checked here
(a picture Pillow recognises as PNG, JPEG, GIF or WebP, at most `RFT_IMAGE_MAX_BYTES` bytes
and `RFT_IMAGE_MAX_PIXELS` pixels; anything else is refused naming the record and the file)
and written to `RFT_STORAGE_DIR/images/<aa>/<sha256>` unless the store already holds those
bytes. The task keeps the digests (`Task.images`); a `TasksetImage` row says which taskset
shows which picture, which is what decides who may fetch it (apps/buffer/views.py).

The content type comes from what Pillow found in the bytes, never from the file name; the
name is kept only as a label (untrusted text, escaped wherever it is shown).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from kernel.exceptions import InvalidInput

if TYPE_CHECKING:
    from PIL import Image

# What browsers render as a picture and nothing else: no SVG (it runs script).
CONTENT_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}
DIGEST = re.compile(r"^[0-9a-f]{64}$")
NAME_MAX = 255


class ImageRejected(InvalidInput):
    """A picture could not be accepted; the message names it."""

    code = "image_rejected"


@dataclass(frozen=True)
class ImageInfo:
    sha256: str
    content_type: str
    width: int
    height: int
    size: int
    name: str


def images_root() -> Path:
    return Path(settings.RFT_STORAGE_DIR) / "images"


def image_path(sha256: str) -> Path:
    """Where the store keeps the picture with this digest (ValueError for a malformed digest)."""
    if not DIGEST.match(sha256 or ""):
        raise ValueError(f"not an image digest: {sha256!r}")
    return images_root() / sha256[:2] / sha256


def _label(name: str) -> str:
    # A label, not a path: no control characters, bounded.
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in str(name))[:NAME_MAX]


def image_check(*, data: bytes, name: str) -> ImageInfo:
    """The picture's facts, or ImageRejected naming `name` (too large, not a picture, a
    format browsers should not be handed)."""
    from PIL import Image, UnidentifiedImageError

    label = _label(name)
    limit = int(settings.RFT_IMAGE_MAX_BYTES)
    if len(data) > limit:
        raise ImageRejected(f"{label}: the image is {len(data)} bytes; the limit is {limit} (RFT_IMAGE_MAX_BYTES)")
    if not data:
        raise ImageRejected(f"{label}: the file is empty, not an image")
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt, (width, height) = img.format, img.size
            pixels = width * height
            max_pixels = int(settings.RFT_IMAGE_MAX_PIXELS)
            if pixels > max_pixels:
                raise ImageRejected(f"{label}: the image is {width}×{height} pixels; the limit is {max_pixels} "
                                    "(RFT_IMAGE_MAX_PIXELS)")
            img.verify()
    except ImageRejected:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageRejected(f"{label}: not an image Pillow can read ({type(exc).__name__})") from None
    if fmt not in CONTENT_TYPES:
        raise ImageRejected(f"{label}: {fmt} images are not accepted; use {', '.join(sorted(CONTENT_TYPES))}")
    return ImageInfo(sha256=hashlib.sha256(data).hexdigest(), content_type=CONTENT_TYPES[fmt], width=width,
                     height=height, size=len(data), name=label)


def image_store(*, data: bytes, name: str) -> ImageInfo:
    """Check the picture and put it in the store once (a digest already there is not rewritten)."""
    info = image_check(data=data, name=name)
    path = image_path(info.sha256)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written beside and renamed: a reader never sees half a file, two writers of the
        # same bytes both end with the same file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return info


def image_bytes(sha256: str) -> bytes:
    return image_path(sha256).read_bytes()


def image_open(sha256: str) -> Image.Image:
    """The stored picture as an RGB PIL image (workers: the engines and the trainer)."""
    from PIL import Image

    with Image.open(image_path(sha256)) as img:
        return img.convert("RGB")
