"""A breadth-first crawl of the site as one person, in a real Chromium: every
same-origin link reachable from where it starts, every form (with the values it shows) and
every htmx control on those pages, except the ones `destructive` names. What it looks for on
each page and after each action: a 5xx anywhere (the page, a partial, a download), a linked
page that answers 4xx, Django's debug page, a console error, an uncaught exception, an htmx
error event, and a page wider than the window, at each width it is given.

A page is covered because a link leads to it: nothing here lists the site's pages. Numeric
ids (and long tokens) in a path collapse, so /runs/1/experiences/57/ and /58/ count once, and
a query counts by its keys; each person stops at `PAGE_CAP` pages and `ACTION_CAP` actions,
and reaching a cap is itself a failure (the cap is raised, nothing is skipped silently).

Forms are sent filled: a field the browser would refuse (a required one left empty, a value
of the wrong type) gets a valid value first, from the person's table of known-good values
(`values`, by the field's name: a password, the username to log in with) or by its type and
constraints (text, email, number, select, textarea, checkbox, ...), the rest as the page
shows them; a form with a field it cannot fill is a failure, not a skip. A POST form is then
sent once more with one field made invalid (a required field emptied, or a value of the wrong
type or choice, the browser's own checks turned off as a non-browser client would send it):
the answer must show a plain error beside the form (no 5xx, no debug page or traceback, an
error element with its text). The person not logged in stays so: a login the crawl sent
with good values is undone (its cookies cleared) before the next step.

Widths: a page is opened, and forms and controls are sent, at the first width; then the same
document is laid out at each further width (the window resized, two frames let the page's own
resize handlers run) and looked at again for a sideways scroll and any error the resize
raised. What a page's server answers, its links, forms and htmx targets do not depend on the
window: opening every page again in a window of each width (as this did until issue 50)
loaded and rendered each page twice for the one check that does, and took half the crawl. What
a form's send leads to (the next page, or the form with its errors) is laid out at each further
width too, so a form is sent at one width and its answer checked at every width."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, urldefrag, urlsplit

PAGE_CAP = 150
ACTION_CAP = 120

# What a crawl never does: log out (the crawl would lose its person), change a run's
# lifecycle (/control/: start, pause, stop, cancel; the run's own tests do that), or take
# something away (delete, remove, revoke, reject, withdraw/undo a label, unmark gold,
# deactivate an account). Everything else is sent as the page shows it: a filter with its
# defaults, an empty "add person" (a form error), "Invite" (a one-time link), a copy of a run
# ("Create run" makes a draft), "Revise" (opens the label's form).
# Matched against a form's action URL and its button's words, or an htmx control's URL and words.
DESTRUCTIVE = re.compile(
    r"log ?out|/logout/|/control/|\b(delete|remove|revoke|reject|withdraw|undo|unmark|deactivate)", re.IGNORECASE)
# Paths the crawl does not follow: static assets (the pages' own loads check them), Django's
# stock admin past its index (its add/change/delete forms are Django's, not this project's).
SKIP_PATH = re.compile(r"^/static/|^/admin/.+")
DOWNLOAD = re.compile(r"\.(jsonl|json|zip|csv|txt|yaml|yml|tar|gz)$|/download/$")
# Django's technical 404 and 500 pages (DEBUG on): what a person must never be shown.
DEBUG_MARKERS = ("You’re seeing this error because you have", "You're seeing this error because you have",
                 "Using the URLconf defined in", 'id="traceback"', "Django Version:",
                 "Traceback (most recent call last)")

# Loaded before every document: htmx's error events and requests in flight reported to the
# test (window.__crawlReport is a binding, so a report survives the navigation that follows).
INIT_SCRIPT = """
(() => {
  const state = {inflight: 0, requests: 0};
  window.__crawl = state;
  const report = (text) => { try { window.__crawlReport(text); } catch (e) {} };
  const describe = (e) => {
    const d = e.detail || {};
    const path = (d.pathInfo && d.pathInfo.requestPath) || (d.requestConfig && d.requestConfig.path) || '';
    const status = d.xhr ? ' ' + d.xhr.status : '';
    const target = typeof d.target === 'string' ? ' target ' + d.target : '';
    return e.type + status + (path ? ' ' + path : '') + target;
  };
  for (const name of ['htmx:responseError', 'htmx:targetError', 'htmx:swapError', 'htmx:sendError',
                      'htmx:onLoadError', 'htmx:oobErrorNoTarget', 'htmx:historyCacheMissLoadError',
                      'htmx:timeout']) {
    document.addEventListener(name, (e) => report(describe(e)), true);
  }
  document.addEventListener('htmx:beforeRequest', () => { state.inflight++; state.requests++; }, true);
  document.addEventListener('htmx:afterRequest', () => { state.inflight = Math.max(0, state.inflight - 1); }, true);
  // A native submit (one htmx did not take over) leaves the page: the test waits for the next one.
  window.addEventListener('submit', (e) => { if (!e.defaultPrevented) state.navigating = true; });
})();
"""

# The page's links, forms and htmx controls, as plain data (each form and control by its index
# among its kind, found again by that index after a reload of the same page).
HARVEST = """
() => {
  const text = (el) => (el.innerText || el.value || el.getAttribute('aria-label') || el.title || '').trim().replace(/\\s+/g, ' ').slice(0, 40);
  const links = Array.from(document.querySelectorAll('a[href]')).map((a) => ({href: a.href, text: text(a)}));
  const forms = Array.from(document.forms).map((f, i) => {
    const button = f.querySelector('button:not([type=button]):not([type=reset]), input[type=submit]');
    return {index: i, method: (f.getAttribute('hx-post') ? 'post' : (f.getAttribute('method') || 'get')).toLowerCase(), action: f.action,
            hx: !!(f.getAttribute('hx-post') || f.getAttribute('hx-get') || f.getAttribute('hx-put') || f.getAttribute('hx-delete')),
            // A person sends a form with its button, or with Enter in its one text field.
            button: !!button || f.querySelectorAll('input:not([type=hidden]):not([type=checkbox]):not([type=radio]):not([type=file])').length === 1,
            label: button ? text(button) : '', id: f.id || f.className || ''};
  });
  const controls = Array.from(document.querySelectorAll('[hx-get], [hx-post]')).map((el, i) => ({
    index: i, url: new URL(el.getAttribute('hx-get') || el.getAttribute('hx-post'), location.href).href,
    post: el.hasAttribute('hx-post'), form: el.tagName === 'FORM',
    clickable: !el.getAttribute('hx-trigger') || /(^|[ ,])click/.test(el.getAttribute('hx-trigger')),
    label: text(el), tag: el.tagName.toLowerCase()}));
  return {links, forms, controls};
}
"""

# The fields of form `i` a person fills (not hidden, not disabled, no button), each by its
# index among them: whether the browser would accept its value now, and its constraints.
FIELDS = """
(i) => {
  const f = document.forms[i];
  if (!f) return null;
  const fields = Array.from(f.elements).filter((el) => ['INPUT', 'SELECT', 'TEXTAREA'].includes(el.tagName)
    && !['hidden', 'submit', 'button', 'reset', 'image'].includes((el.type || '').toLowerCase()) && !el.disabled);
  return fields.map((el, k) => ({
    k, name: el.name || el.id || '', value: el.value || '',
    type: el.tagName === 'INPUT' ? (el.getAttribute('type') || 'text').toLowerCase() : el.tagName.toLowerCase(),
    required: el.required, valid: el.checkValidity(), min: el.min || '', max: el.max || '', step: el.step || '',
    minlength: el.minLength > 0 ? el.minLength : 0, maxlength: el.maxLength > 0 ? el.maxLength : 0,
    pattern: el.pattern || '',
    options: el.tagName === 'SELECT' ? Array.from(el.options).filter((o) => !o.disabled).map((o) => o.value) : [],
  }));
}
"""

# Set fields of form `i` (each {k, value, how}: `value` as a person types or picks it, `check`
# for a box or radio, `choice` a select option the page does not offer, `mistype` a text in a
# typed field) and send it with its button; `novalidate`: the browser's checks off, as a
# client other than a browser sends it.
FILL_AND_SEND = """
([i, fills, novalidate]) => {
  const f = document.forms[i];
  if (!f) return 'gone';
  // A ranking (static/feedback/rank.js) is filled as a person does it, tapping the completions
  // best first: its script sends nothing until every completion has a place.
  if (f.classList.contains('rank-js')) {
    f.querySelectorAll('.rank-item .completion').forEach((c) => c.click());
  }
  const fields = Array.from(f.elements).filter((el) => ['INPUT', 'SELECT', 'TEXTAREA'].includes(el.tagName)
    && !['hidden', 'submit', 'button', 'reset', 'image'].includes((el.type || '').toLowerCase()) && !el.disabled);
  for (const {k, value, how} of fills) {
    const el = fields[k];
    if (how === 'check') { el.checked = true; }
    else if (how === 'choice') { el.add(new Option(value, value)); el.value = value; }
    else if (how === 'mistype') { el.type = 'text'; el.value = value; }
    else if (how !== 'file') { el.value = value; }
    el.dispatchEvent(new Event('input', {bubbles: true}));
    el.dispatchEvent(new Event('change', {bubbles: true}));
  }
  f.noValidate = !!novalidate;
  if (!novalidate && !f.checkValidity()) {
    return 'blocked: ' + fields.filter((el) => !el.checkValidity())
      .map((el) => (el.name || el.id) + ' (' + el.validationMessage + ')').join(', ');
  }
  window.__crawl.navigating = false;
  const b = f.querySelector('button:not([type=button]):not([type=reset]), input[type=submit]');
  f.requestSubmit(b || undefined);
  return window.__crawl.navigating ? 'navigating' : 'htmx';
}
"""

# The error a form shows beside itself after a refused send: an element of the project's
# error styles (templates: .field-error, Django's .errorlist, role=alert) with text, visible.
ERROR_SHOWN = """
() => Array.from(document.querySelectorAll('.field-error, .errorlist, [role=alert], .errors, .error'))
  .filter((e) => e.offsetParent !== null && e.innerText.trim()).map((e) => e.innerText.trim().slice(0, 80))
"""

# htmx controls whose target is not on the page (htmx:targetError when used): checked on every
# page, so a control needs clicking once only, not on every page it appears on.
MISSING_TARGETS = """
() => {
  const missing = {};
  for (const el of document.querySelectorAll('[hx-get], [hx-post], [hx-put], [hx-patch], [hx-delete]')) {
    const holder = el.closest('[hx-target]');
    const target = holder ? holder.getAttribute('hx-target').trim() : '';
    if (!target || target === 'this' || /^(closest|find|next|previous|body|window|document)\\b/.test(target)) continue;
    let found = null;
    try { found = document.querySelector(target); } catch (e) { found = null; }
    if (found) continue;
    const what = el.tagName === 'FORM' ? 'form.' + el.className : (el.innerText || el.className || '').trim().replace(/\\s+/g, ' ').slice(0, 30);
    (missing[target] = missing[target] || []).push(what);
  }
  return Object.entries(missing).map(([target, els]) =>
    'htmx target ' + target + ' is not on the page (for \\'' + els[0] + '\\'' + (els.length > 1 ? ' and others' : '') + ')');
}
"""

# How far the document sticks out sideways, and the elements that stick out the most.
OVERFLOW = """
() => {
  const root = document.documentElement;
  const over = root.scrollWidth - root.clientWidth;
  if (over <= 1) return null;
  const wide = Array.from(document.querySelectorAll('body *'))
    .filter((e) => e.getBoundingClientRect().right > root.clientWidth + 1)
    .sort((a, b) => b.getBoundingClientRect().right - a.getBoundingClientRect().right)
    .slice(0, 3)
    .map((e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && typeof e.className === 'string' ? '.' + e.className.trim().split(/\\s+/).join('.') : '') + ' ' + Math.round(e.getBoundingClientRect().right) + 'px');
  return over + ' px wider than the window (' + wide.join(', ') + ')';
}
"""


def pattern(url: str) -> str:
    """The URL with its ids collapsed (every run of digits, and any long token with a digit in
    it) and its query reduced to its keys: one page of its kind."""
    parts = urlsplit(url)
    segments = ["{id}" if len(s) >= 16 and re.search(r"\d", s) else re.sub(r"\d+", "{n}", s)
                for s in parts.path.split("/")]
    keys = sorted({key for key, _ in parse_qsl(parts.query, keep_blank_values=True)})
    return "/".join(segments) + ("?" + "&".join(keys) if keys else "")


def destructive(*words: str) -> bool:
    return any(DESTRUCTIVE.search(w) for w in words if w)


# Valid values by a field's type, where the person's table (`Crawl.values`) names none.
BY_TYPE = {"email": "crawler@example.com", "url": "https://example.com/", "tel": "5550100", "date": "2026-01-15",
           "datetime-local": "2026-01-15T12:00", "time": "12:00", "month": "2026-01", "week": "2026-W03",
           "color": "#336699", "text": "crawl", "search": "crawl", "textarea": "A crawl's text."}


def field_value(field: dict[str, Any], values: dict[str, str]) -> tuple[str, str] | None:
    """A valid value for `field` (one of FIELDS' entries) and how to set it: the person's
    known-good value by the field's name, else one by its type within its constraints; None
    where neither fits (a password nobody gave, a pattern, a file): the crawl cannot fill it."""
    kind, name = field["type"], field["name"]
    if kind in ("checkbox", "radio"):
        return values.get(name, field["value"]), "check"
    if name in values:
        return values[name], "file" if kind == "file" else "value"
    if kind == "select":
        options = [o for o in field["options"] if o]
        return (options[0], "value") if options else None
    if kind in ("number", "range"):
        low = float(field["min"]) if field["min"] else None
        high = float(field["max"]) if field["max"] else None
        number = low if low is not None else (min(1.0, high) if high is not None else 1.0)
        return (f"{number:g}", "value")
    if kind not in BY_TYPE or field["pattern"]:
        return None  # a password, a file, a pattern: only the person's table knows a good one
    text = BY_TYPE[kind]
    if field["minlength"] > len(text):
        text = (text + " ") * (field["minlength"] // len(text) + 1)
    return (text[:field["maxlength"]] if field["maxlength"] else text), "value"


def field_spoiled(field: dict[str, Any]) -> tuple[str, str, str] | None:
    """One invalid value for `field` the server must refuse, how to set it and what it is: a
    required field emptied, else a value of the wrong type or a choice the page does not offer;
    None where a field takes anything."""
    kind = field["type"]
    if field["required"] and kind not in ("checkbox", "radio", "file"):
        if kind != "select":
            return "", "value", f"{field['name']} left empty"
        if "" in field["options"]:
            return "", "value", f"{field['name']} left unchosen"
    if kind == "select":
        return "no-such-choice", "choice", f"{field['name']} not one of its choices"
    if kind in ("number", "range"):
        return "not-a-number", "mistype", f"{field['name']} not a number"
    if kind == "email":
        return "not-an-email", "mistype", f"{field['name']} not an email address"
    return None


@dataclass
class Action:
    """A form to submit or an htmx control to click, on the page `url`."""

    kind: str  # "form" or "control"
    url: str
    index: int
    target: str
    label: str
    hx: bool = False
    method: str = "get"

    def describe(self) -> str:
        what = f"{self.method.upper()} form" if self.kind == "form" else "htmx control"
        return f"{what} '{self.label}' -> {urlsplit(self.target).path} on {urlsplit(self.url).path}"


@dataclass
class Crawl:
    """One person's crawl (pages opened at `width`, laid out at `also` too): what it opened and
    what went wrong."""

    context: Any  # the person's own Playwright browser context (logged in or not)
    base: str
    person: str
    width: int
    also: tuple[int, ...] = ()  # the further widths each page is laid out at
    # Known-good values by field name (the person's password, a username to log in with).
    values: dict[str, str] = field(default_factory=dict)
    anonymous: bool = False  # a login the crawl sends is undone: the person stays logged out
    visited: list[str] = field(default_factory=list)
    opened: int = 0  # pages opened
    sent: int = 0  # forms sent filled, and controls clicked
    refused: int = 0  # forms sent once more with an invalid value (the plain error shown)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (where, what)
    skipped: dict[str, None] = field(default_factory=dict)  # the actions not taken, once each
    events: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    page: Any = None

    def __post_init__(self) -> None:
        self.context.expose_binding("__crawlReport", lambda source, text: self.reports.append(str(text)))
        self.context.add_init_script(INIT_SCRIPT)
        self.page = self.context.new_page()
        self.page.set_viewport_size(_window(self.width))
        self.page.set_default_timeout(30_000)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.events.append(f"uncaught exception: {str(exc)[:300]}"))
        self.page.on("response", self._response)
        self.page.on("dialog", lambda dialog: dialog.accept())

    def _console(self, msg: Any) -> None:
        source = (msg.location or {}).get("url", "")
        # htmx logs each error event to the console too: the event itself is reported, with more.
        if msg.type == "error" and not source.endswith("/htmx.min.js"):
            at = f" ({source.removeprefix(self.base)})" if source else ""
            self.events.append(f"console error: {msg.text[:300]}{at}")

    def _response(self, response: Any) -> None:
        if response.url.startswith(self.base) and response.status >= 500:
            self.events.append(f"{response.status} from {response.request.method} {urlsplit(response.url).path}")

    def _drain(self) -> list[str]:
        found = [*self.events, *self.reports]
        self.events.clear()
        self.reports.clear()
        # One line per distinct problem (htmx logs its error events to the console as well).
        return list(dict.fromkeys(found))

    def _fail(self, where: str, what: str) -> None:
        self.failures.append((where, what))

    def settle(self) -> None:
        """Until the document has loaded and no htmx request is in flight."""
        for _ in range(5):
            try:
                self.page.wait_for_load_state("load")
                self.page.wait_for_function(
                    "() => window.__crawl && window.__crawl.inflight === 0 && document.readyState === 'complete'",
                    polling="raf", timeout=30_000)
                return
            except Exception as exc:  # a navigation replaced the document while we waited
                if "destroyed" not in str(exc) and "navigat" not in str(exc):
                    raise

    def check(self, where: str, *, status: int | None = None, link: bool = False, sent_to: str = "",
              targets: bool = False) -> None:
        """Everything that can be wrong with the page now shown. `sent_to`: the path a form
        was just sent to, whose 4xx (the form with its errors) the browser logs as a console
        error that is no fault (an htmx form's 4xx is: htmx shows nothing, htmx:responseError)."""
        answered = re.compile(rf"^console error: Failed to load resource: .* status of 4\d\d .*"
                              rf"\({re.escape(sent_to)}(\?[^)]*)?\)$")  # the form's action may carry a query
        for event in self._drain():
            if not (sent_to and answered.match(event)):
                self._fail(where, event)
        if status is not None and status >= 500:
            self._fail(where, f"answers {status}")
        elif status is not None and link and status >= 400:
            self._fail(where, f"a link leads to a {status}")
        html = self.page.content()
        marker = next((m for m in DEBUG_MARKERS if m in html), None)
        if marker:
            self._fail(where, f"Django's debug page ({marker!r})")
        wide = self.page.evaluate(OVERFLOW)
        if wide:
            self._fail(where, f"scrolls sideways: {wide}")
        if targets:
            for missing in self.page.evaluate(MISSING_TARGETS):
                self._fail(where, missing)

    def run(self, start: str = "/") -> None:
        pages: deque[tuple[str, str]] = deque([(self.base + start, "start")])
        actions: deque[Action] = deque()
        seen: set[str] = {pattern(self.base + start)}
        done_actions: set[tuple[str, ...]] = set()
        acted = 0
        while pages or actions:
            if pages:
                url, via = pages.popleft()
                if len(self.visited) >= PAGE_CAP:
                    self._fail(url, f"the crawl's page cap ({PAGE_CAP}) is reached: raise it")
                    break
                self._guarded(url, lambda: self._open(url, via, pages, actions, seen, done_actions))
            else:
                action = actions.popleft()
                if acted >= ACTION_CAP:
                    self._fail(action.url, f"the crawl's action cap ({ACTION_CAP}) is reached: raise it")
                    break
                acted += 1
                self._guarded(action.describe(), lambda: self._act(action, pages, seen))

    def _guarded(self, where: str, step: Callable[[], None]) -> None:
        """One page or action; a browser error (a timeout, a page that never settles) is a
        failure of that step, and the crawl goes on with the next. The step's seconds end its
        line of the visit report (where the next cut of the crawl's time starts)."""
        started, visited = time.monotonic(), len(self.visited)
        try:
            step()
        except Exception as exc:
            first_line = str(exc).splitlines()[0][:200]
            self._fail(where.removeprefix(self.base), f"the crawl could not finish it: {first_line}")
        if len(self.visited) > visited:
            self.visited[-1] += f"  [{time.monotonic() - started:.1f} s]"

    def _open(self, url: str, via: str, pages: deque[tuple[str, str]], actions: deque[Action], seen: set[str],
              done_actions: set[tuple[str, ...]]) -> None:
        path = url[len(self.base):] or "/"
        if DOWNLOAD.search(urlsplit(url).path):
            self._download(url, via)
            return
        try:
            response = self.page.goto(url, wait_until="load")
        except Exception as exc:
            if "Download is starting" in str(exc):
                self._download(url, via)
                return
            self._fail(path, f"could not be opened ({str(exc).splitlines()[0][:200]})")
            return
        self.settle()
        self.opened += 1
        self.visited.append(f"{path}  <- {via}")
        self.check(path, status=response.status if response else None, link=True, targets=True)
        self._harvest(url, pages, actions, seen, done_actions)
        self._laid_out_wider(path)

    def _laid_out_wider(self, path: str) -> None:
        """The page just opened, laid out at each further width in turn, then back at the
        first (where the next page opens and every action is sent)."""
        for width in self.also:
            self.page.set_viewport_size(_window(width))
            # Two frames: the resize event's handlers (htmx, the charts) have run and the
            # layout they change is the one measured.
            self.page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
            where = f"{path} at {width} px"
            for event in self._drain():
                self._fail(where, event)
            wide = self.page.evaluate(OVERFLOW)
            if wide:
                self._fail(where, f"scrolls sideways: {wide}")
        if self.also:
            self.page.set_viewport_size(_window(self.width))

    def _download(self, url: str, via: str) -> None:
        path = url[len(self.base):]
        response = self.page.request.get(url)
        self.opened += 1
        self.visited.append(f"{path}  <- {via} (download, {response.status})")
        if response.status >= 400:
            self._fail(path, f"a download link answers {response.status}")

    def _harvest(self, url: str, pages: deque[tuple[str, str]], actions: deque[Action], seen: set[str],
                 done_actions: set[tuple[str, ...]]) -> None:
        found = self.page.evaluate(HARVEST)
        here = urlsplit(self.page.url).path
        for link in found["links"]:
            href = urldefrag(link["href"]).url
            if not href.startswith(self.base) or urlsplit(href).scheme not in ("http", "https"):
                continue
            target = urlsplit(href).path
            if SKIP_PATH.search(target) or destructive(target):
                continue
            key = pattern(href)
            if key not in seen:
                seen.add(key)
                pages.append((href, f"link '{link['text']}' on {here}"))
        for form in found["forms"]:
            if not form["button"]:
                continue  # nothing a person can send it with (a read-only view of a form, for a viewer)
            self._plan(Action("form", self.page.url, form["index"], form["action"], form["label"] or form["id"],
                              form["hx"], form["method"]), actions, done_actions)
        for control in found["controls"]:
            if control["clickable"] and not control["form"]:
                self._plan(Action("control", self.page.url, control["index"], control["url"], control["label"],
                                  True, "post" if control["post"] else "get"), actions, done_actions)

    def _plan(self, action: Action, actions: deque[Action], done_actions: set[tuple[str, ...]]) -> None:
        if action.method == "dialog" or not action.target.startswith(self.base):
            return
        # A GET (a filter, a sort, a refresh) counts once per kind of page it asks for; a POST
        # once per button too (accept and reject post to one URL).
        # Once wherever it shows (check() finds a control whose target is missing on any page).
        # A label's numbers do not make another kind of button ("Prepare v5", "Prepare v6").
        key = (action.kind, pattern(action.target), re.sub(r"\d+", "{n}", action.label) if action.method == "post" else "")
        if key in done_actions:
            return
        done_actions.add(key)
        if destructive(urlsplit(action.target).path, action.label):
            self.skipped[action.describe()] = None
            return
        actions.append(action)

    def _enqueue(self, url: str, via: str, pages: deque[tuple[str, str]], seen: set[str]) -> None:
        """Open `url` later, unless a page of its kind is already seen (or it is no page to open)."""
        if url.startswith(self.base) and pattern(url) not in seen and not SKIP_PATH.search(urlsplit(url).path):
            seen.add(pattern(url))
            pages.append((url, via))

    def _act(self, action: Action, pages: deque[tuple[str, str]], seen: set[str]) -> None:
        """Open the action's page afresh, then send the form filled (`_fill`) or click the
        control, as a person would; then check what it led to, at every width. A POST form is
        then sent once more with an invalid value (`_refused`)."""
        where = action.describe()
        self._reopen(action.url)
        action = self._found_again(action) or action  # not found: its index, and the failure below if gone
        requests = 0
        if action.kind == "form":
            fields = self.page.evaluate(FIELDS, action.index)
            fills = None if fields is None else self._fills(where, fields)
            if fills is None:
                self.visited.append(f"{where}: not sent ({'not on the page again' if fields is None else 'a field it cannot fill'})")
                if fields is None:
                    self._fail(where, "the form is not on its page when opened again")
                return
            self._file_inputs(action.index, fills)
            requests = self.page.evaluate("() => window.__crawl.requests")
            outcome = self.page.evaluate(FILL_AND_SEND, [action.index, fills, False])
        else:
            outcome = self.page.evaluate(
                """(i) => { const el = document.querySelectorAll('[hx-get], [hx-post]')[i]; if (!el) return 'gone';
                   el.click(); return 'htmx'; }""", action.index)
        if outcome == "gone" or outcome.startswith("blocked"):
            self.visited.append(f"{where}: not sent ({outcome})")
            self._fail(where, f"not sent: {'not on the page again' if outcome == 'gone' else outcome}")
            return
        self.settle()
        if action.kind == "form" and action.hx and outcome == "htmx" and urlsplit(self.page.url).path == urlsplit(
                action.url).path and self.page.evaluate("() => window.__crawl.requests") == requests:
            # The page's own script held the form back although every field was valid.
            self.visited.append(f"{where}: not sent (the page's script sent nothing)")
            self._fail(where, "filled, it was not sent: the page's script held it back (fill it as a person would)")
            return
        self.sent += 1
        filled = f" ({len(fills)} fields filled)" if action.kind == "form" and fills else ""
        self.visited.append(f"{where}: sent{filled}, now on {urlsplit(self.page.url).path}")
        self.check(where, sent_to=urlsplit(action.target).path if action.kind == "form" else "")
        self._laid_out_wider(where)
        landed = self.page.url
        self._logged_out_again()
        if action.kind == "form" and action.method == "post":
            self._refused(action, where)
        if action.method == "post" and urlsplit(landed).path == urlsplit(action.target).path:
            return  # the POST's own answer (a form with its errors): not a page to GET
        self._enqueue(landed, f"after {where}", pages, seen)

    def _found_again(self, action: Action) -> Action | None:
        """The action on the page opened again, by what it sends and its label rather than its
        index alone: an earlier action may have added or removed a form above it (a version
        prepared turns its form into a link). None where nothing matches."""
        found = self.page.evaluate(HARVEST)
        if action.kind == "form":
            same = [f["index"] for f in found["forms"] if f["action"] == action.target and (f["label"] or f["id"]) == action.label]
        else:
            same = [c["index"] for c in found["controls"] if c["url"] == action.target and c["label"] == action.label]
        return replace(action, index=same[0]) if same else None

    def _reopen(self, url: str) -> None:
        self.page.goto(url, wait_until="load")
        self.settle()
        self._drain()  # the page itself was checked when it was opened

    def _fills(self, where: str, fields: list[dict[str, Any]], *, but: int | None = None) -> list[dict[str, Any]] | None:
        """What to set so that the browser accepts the form: a valid value for each field it
        would refuse now (but field `but`); None, with a failure naming them, where some field
        cannot be filled."""
        fills: list[dict[str, Any]] = []
        unfillable: list[str] = []
        for f in fields:
            if f["valid"] or f["k"] == but:
                continue
            if f["type"] == "radio" and any(x["k"] in {y["k"] for y in fills} for x in fields if x["name"] == f["name"]):
                continue  # one radio of a group checked is the group filled
            value = field_value(f, self.values)
            if value is None:
                unfillable.append(f"{f['name'] or '(no name)'} ({f['type']})")
            else:
                fills.append({"k": f["k"], "value": value[0], "how": value[1], "name": f["name"]})
        if unfillable:
            self._fail(where, f"the crawl cannot fill {', '.join(unfillable)}: give a known-good value (Crawl.values)")
            return None
        return fills

    def _file_inputs(self, index: int, fills: list[dict[str, Any]]) -> None:
        """A file field's known-good value is a path: set as a person picks a file."""
        for fill in fills:
            if fill["how"] == "file":
                self.page.locator("form").nth(index).locator(f"[name='{fill['name']}']").set_input_files(fill["value"])

    def _refused(self, action: Action, sent: str) -> None:
        """The POST form again, its fields filled but one made invalid, sent past the browser's
        checks: the answer must be the form with a plain error (the 4xx is no fault; a 5xx, a
        debug page or no error shown is)."""
        self._reopen(action.url)
        again = self._found_again(action)
        if again is None:  # a form that acts once (a version prepared): gone once sent, as it should be
            self.visited.append(f"{sent}: gone once sent, not sent again")
            return
        action = again
        fields = self.page.evaluate(FIELDS, action.index) or []
        # A required field emptied first: what a person most often sends by mistake.
        spoil = next(((f, bad) for f in sorted(fields, key=lambda f: not f["required"])
                      if (bad := field_spoiled(f)) is not None), None)
        if spoil is None:
            self.visited.append(f"{sent}: no field takes an invalid value")
            return
        field_, (value, how, what) = spoil
        fills = self._fills(sent, fields, but=field_["k"])
        if fills is None:
            return
        where = f"{sent} with {what}"
        self._file_inputs(action.index, fills)
        outcome = self.page.evaluate(FILL_AND_SEND, [action.index, [*fills, {"k": field_["k"], "value": value, "how": how}],
                                                     True])
        if outcome == "gone":
            self._fail(where, "the form is not on its page when opened again")
            return
        self.settle()
        self.refused += 1
        try:  # a refused htmx form's message is put in by the page's script as the answer lands
            self.page.wait_for_function(f"() => ({ERROR_SHOWN.strip()})().length > 0", polling="raf", timeout=10_000)
        except Exception as exc:
            if "Timeout" not in str(exc) and "destroyed" not in str(exc):
                raise
        shown = self.page.evaluate(ERROR_SHOWN)
        self.visited.append(f"{where}: {'shows ' + repr(shown[0]) if shown else 'shows no error'}")
        self.check(where, sent_to=urlsplit(action.target).path)
        if not shown:
            self._fail(where, "the answer shows no error beside the form (.field-error, .errorlist or role=alert)")
        self._laid_out_wider(where)
        self._logged_out_again()

    def _logged_out_again(self) -> None:
        """The person not logged in stays so (a login the crawl sent with good values is undone)."""
        if self.anonymous and any(c["name"] == "sessionid" for c in self.context.cookies()):
            self.context.clear_cookies()


def _window(width: int) -> dict[str, int]:
    """A phone's window below 600 px, a laptop's above."""
    return {"width": width, "height": 844 if width < 600 else 800}


def failure_report(crawls: list[Crawl]) -> list[str]:
    """Every failure of every crawl, one line per problem and kind of page (numbers collapsed),
    naming the people that met it (a width other than the first is named where it was met)."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for crawl in crawls:
        for where, what in crawl.failures:
            key = (_ids(where), _ids(what))
            who = crawl.person
            if who not in grouped.setdefault(key, []):
                grouped[key].append(who)
    return [f"{where}: {what}  [{', '.join(who)}]" for (where, what), who in grouped.items()]


def _ids(text: str) -> str:
    """Ids in paths, element ids and labels (/runs/1/, #item-7, 'compare with #12') as {n}."""
    return re.sub(r"(?<=[/#=-])\d+(?=[/\s'),.?&:]|$)", "{n}", text)


def summary_lines(crawls: list[Crawl]) -> list[str]:
    """One line a person: pages opened, actions taken, forms refused with an invalid value."""
    return [f"{c.person} at {' and '.join(f'{w} px' for w in (c.width, *c.also))}: {c.opened} pages, "
            f"{c.sent} actions sent, {c.refused} forms sent invalid (plain error shown), "
            f"{len(c.skipped)} actions not taken, {len(c.failures)} problems" for c in crawls]


def visit_report(crawls: list[Crawl]) -> str:
    lines = []
    for crawl in crawls:
        widths = " and ".join(f"{w} px" for w in (crawl.width, *crawl.also))
        lines.append(f"== {crawl.person} at {widths}: {len(crawl.visited)} pages and actions, "
                     f"{len(crawl.skipped)} actions not taken")
        lines += [f"   {v}" for v in crawl.visited]
        lines += [f"   (not taken: {s})" for s in crawl.skipped]
    return "\n".join(lines)
