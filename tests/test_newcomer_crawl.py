"""A newcomer's `make run`, crawled (issue 45 item 3): the README's commands as they are
(`manage.py migrate`, `rft_demo`, `rft_serve`) on a fresh var directory, the demo as a newcomer
gets it and starts it, then Chromium opens every link and every form reachable from the
landing page (tests/crawler.py) as five people at 390 and 1280 px: the demo's owner and
annotator, a viewer and a new annotator who each join through an invitation link the owner
makes on the run page, and someone not logged in. Every form is sent filled with valid values
(`known_good`: the person's own password and login; the rest by field type), and each POST
form once more with an invalid value, whose answer must show the plain error (issue 62.7). It
fails on any 5xx, any Django debug page, any console or htmx error, any form it cannot fill
and any page that scrolls sideways, all of them listed in one failure, and prints a line per
person on success too (the pages it visited per person with a failure).

What it does not repeat (issue 50: the crawl was a quarter of the suite's longest worker):
each person's crawl opens every page and sends every form and control once, at 390 px, and
lays each page, and what each send led to, out at 1280 px too by resizing the window (tests/crawler.py: what the server
answers does not depend on the window, so each page is loaded once, not once per width). The
invited annotator joins at 390 px and logs in at 1280 px with the password they chose."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from rftweb import localpg
from tests.crawler import Crawl, failure_report, summary_lines, visit_report
from tests.servers import ROOT, embedded_env, free_port, health_wait, spawn, stop

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "rftweb-demo"  # rft_demo's, as the README tells a newcomer
NEW_PASSWORD = "a-newcomers-password-42"
PHONE, LAPTOP = 390, 1280  # pages are opened and actions sent at the phone's width
PEOPLE = ("owner", "annotator", "viewer", "invited", "anonymous")


class Served(NamedTuple):
    url: str
    run_path: str  # the demo run's page
    log: Path  # rft_serve's output


@pytest.fixture(scope="module")
def make_run(demo_model_dir: Path) -> Iterator[Served]:
    """`make run`'s commands on a fresh var directory (the tests' cached demo model, which
    rft_demo finds up to date)."""
    # Not under pytest's tmp_path: as root the private PostgreSQL runs as another user, who
    # must pass through the folders above its data (tests/servers.py, embedded_var).
    var = Path(tempfile.mkdtemp(prefix="rftweb-newcomer-"))
    env = embedded_env(var, RFT_DEMO_MODEL_DIR=str(demo_model_dir), PYTHONPATH=str(ROOT))
    with localpg.stopped_after(localpg.Cluster(data=var / "postgres")):
        for command in (["migrate", "--noinput"], ["rft_demo"]):
            done = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, f"manage.py {' '.join(command)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        demo = re.search(r"run #(\d+) ", done.stdout)
        assert demo, done.stdout
        port = free_port()
        log = var / "serve.log"
        server = spawn([sys.executable, "manage.py", "rft_serve", "--port", str(port)], env=env, log=log)
        url = f"http://127.0.0.1:{port}"
        try:
            if not health_wait(url, seconds=120, poll=0.5, alive=lambda: server.poll() is None):
                pytest.fail(f"rft_serve did not answer: {log.read_text()[-3000:]}")
            yield Served(url, f"/runs/{demo.group(1)}/", log)
        finally:
            stop(server, timeout=30)
    shutil.rmtree(var, ignore_errors=True)


def log_in(context: Any, base: str, username: str, password: str) -> None:
    page = context.new_page()
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/runs/")
    page.close()


def invitation_link(owner: Any, base: str, run_path: str, role: str) -> str:
    """The owner makes a one-time link on the run page's invitation box (email left blank)."""
    page = owner.new_page()
    page.goto(base + run_path)
    page.select_option("#id_invite_role", role)
    page.click("#invitations button[type=submit]")
    link = page.locator("#id_invite_link")
    link.wait_for()
    url = str(link.input_value())
    page.close()
    return url


def join(context: Any, link: str, username: str) -> None:
    """Someone without an account opens the link on a phone, picks a username, then a password."""
    page = context.new_page()
    page.set_viewport_size({"width": PHONE, "height": 844})
    page.goto(link)
    page.fill("#id_username", username)
    page.click("#invitation button[type=submit]")
    page.fill("#id_new_password1", NEW_PASSWORD)
    page.fill("#id_new_password2", NEW_PASSWORD)
    page.click("#set-password button[type=submit]")
    page.wait_for_url("**/runs/")
    page.close()


def demo_started(owner: Any, annotator: Any, base: str, run_path: str) -> None:
    """What a newcomer does first: the owner starts the demo run from its page, the annotator
    rates the first answer that reaches their queue."""
    page = owner.new_page()
    page.goto(base + run_path)  # rft_demo's message names it (the crawl checks the runs list's link)
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#controls a.control-start")
    page.wait_for_selector("#run-status:has-text('running')")
    page.close()
    rater = annotator.new_page()
    rater.goto(f"{base}{run_path}annotate/")
    # The explorer loads the demo model and writes its first group: the stream brings the cards.
    card = rater.locator("article.item:not(.done)").first
    card.wait_for(timeout=300_000)
    card.locator("input[name=score][value='5']").check()
    card.locator("form.rate button[type=submit]").click()
    rater.wait_for_selector("#mine-box .submission")
    rater.close()
    # Then the owner pauses it to look around: the crawl sees a run with answers, labels and
    # versions that holds still (a running loop would change pages between two widths).
    page = owner.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(base + run_path)
    page.click("#controls a.control-pause")
    page.wait_for_selector("#run-status:has-text('paused')")
    page.close()


def known_good(person: str) -> dict[str, str]:
    """The values only the person knows, by field name: their own password where a form asks
    for it (a password change keeps it, so the rest of the crawl is unchanged); for someone
    not logged in, an annotator's login (the crawl logs them out again after)."""
    if person == "anonymous":
        return {"username": "annotator", "password": PASSWORD}
    password = NEW_PASSWORD if person in ("viewer", "invited") else PASSWORD
    return {"password": password, "old_password": password, "new_password1": password, "new_password2": password}


def crawl_everyone(browser: Any, base: str, run_path: str) -> list[Crawl]:
    """The people set up as a newcomer would (at the laptop's width, the joining on a phone),
    then each one's crawl."""
    contexts = {person: browser.new_context(viewport={"width": LAPTOP, "height": 800}) for person in PEOPLE}
    try:
        log_in(contexts["owner"], base, "owner", PASSWORD)
        log_in(contexts["annotator"], base, "annotator", PASSWORD)
        demo_started(contexts["owner"], contexts["annotator"], base, run_path)
        for person, role in (("viewer", "viewer"), ("invited", "annotator")):
            join(contexts[person], invitation_link(contexts["owner"], base, run_path, role), person)
            # The password they chose lets them in again (another browser: no session cookie).
            again = browser.new_context(viewport={"width": LAPTOP, "height": 800})
            try:
                log_in(again, base, person, NEW_PASSWORD)
            finally:
                again.close()
        crawls = []
        for person, context in contexts.items():
            crawl = Crawl(context, base, person, PHONE, also=(LAPTOP,), values=known_good(person),
                          anonymous=person == "anonymous")
            crawl.run("/")
            crawls.append(crawl)
        return crawls
    finally:
        for context in contexts.values():
            context.close()


# 263 s in all alone at load 17-20 (crawl 210 s, 355 items); then 153 s, 250 items at load 9-15;
# every form filled and sent invalid too (issue 62.7): 140 s (crawl 119 s, 297 items) against the
# crawl before it, back to back at load 6.5-7.0: 115 s (crawl 103 s, 250 items), 2026-11-28.
@pytest.mark.timeout(1200)
def test_a_newcomer_crawl_of_every_page_as_everyone(browser: Any, make_run: Served,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    crawls = crawl_everyone(browser, make_run.url, make_run.run_path)
    print(visit_report(crawls))  # shown with a failure (or -s)
    # A line a person, shown whatever the outcome: how much of the site each one covered.
    with capsys.disabled():
        print("\n" + "\n".join(f"crawl: {line}" for line in summary_lines(crawls)))
        print(f"crawl: {time.monotonic() - started:.0f} s from the first login to the end of the crawl; "
              f"{sum(len(c.visited) for c in crawls)} pages and actions")
    failures = failure_report(crawls)
    answered_5xx = any(re.search(r"\b5\d\d\b", f) for f in failures)
    server_errors = make_run.log.read_text(errors="replace")[-4000:] if answered_5xx else ""
    assert not failures, (f"{len(failures)} problems a newcomer meets:\n" + "\n".join(failures)
                          + (f"\n\nrft_serve's log ends:\n{server_errors}" if server_errors else ""))
