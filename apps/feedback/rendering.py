"""Model output as safe HTML: Markdown and code blocks, never raw HTML.

markdown-it renders with `html` off, so tags in the text come out as text; links are kept
only for http, https and mailto; images become their alt text (a completion must not make
the annotator's browser fetch URLs). nh3 then cleans the result with an allow-list, as a
second line of defence should the renderer ever let something through.
"""

from __future__ import annotations

from functools import lru_cache

import nh3
from markdown_it import MarkdownIt

SAFE_SCHEMES = ("http://", "https://", "mailto:")
_TAGS = {
    "p", "br", "hr", "pre", "code", "em", "strong", "blockquote", "ul", "ol", "li",
    "h1", "h2", "h3", "h4", "h5", "h6", "a", "table", "thead", "tbody", "tr", "th", "td", "del",
}
_ATTRIBUTES = {"a": {"href", "title"}, "code": {"class"}, "ol": {"start"}, "th": {"style"}, "td": {"style"}}
LONG_CHARS = 1500
LONG_LINES = 30


def _link_ok(url: str) -> bool:
    return url.strip().lower().startswith(SAFE_SCHEMES)


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.disable("image")
    md.validateLink = _link_ok  # type: ignore[method-assign]
    return md


def markdown_safe(text: str) -> str:
    """Sanitised HTML for untrusted Markdown."""
    html = _markdown().render(text or "")
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="nofollow noopener noreferrer",
        filter_style_properties={"text-align"},
    )


def is_long(text: str) -> bool:
    text = text or ""
    return len(text) > LONG_CHARS or text.count("\n") >= LONG_LINES
