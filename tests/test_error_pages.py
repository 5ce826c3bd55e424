"""The site's own 404 and 500 pages on the server `make run` starts (issue 45 item 2):
`manage.py rft_serve` with DEBUG left at its default (on), never Django's technical pages."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client, override_settings

from bench.common import health_wait
from tests.servers import ROOT, child_env, free_port, spawn, stop

pytestmark = pytest.mark.django_db(transaction=True)

# What only Django's technical pages say.
TECHNICAL = ("Django tried these URL patterns", "URLconf", "Traceback", "DEBUG = True", "RuntimeError",
             "a test-only", "Request Method", "settings file")


@pytest.fixture(scope="module")
def served(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`manage.py rft_serve` as `make run` runs it (no DEBUG in its environment; workers elsewhere),
    its URLs with two failing test-only views."""
    env = child_env(DJANGO_SETTINGS_MODULE="tests.errorpages_settings")
    env.pop("DEBUG", None)
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    port = free_port()
    with django_db_blocker.unblock():
        proc = spawn([sys.executable, "manage.py", "rft_serve", "--port", str(port), "--workers", "no"], env=env, log=log,
                     cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            assert health_wait(url, seconds=60, alive=lambda: proc.poll() is None), log.read_text()[-3000:]
            yield url, log
        finally:
            stop(proc)


def site_page(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text[:2000]
    html = response.text
    assert 'class="topbar"' in html and "/static/rftweb/app.css" in html  # the site's look
    assert f'data-status="{status}"' in html
    for words in TECHNICAL:
        assert words not in html, words
    return html


def test_debug_is_on_under_make_run_and_static_files_are_served(served: tuple[str, Path]) -> None:
    url, _ = served
    # The settings the demo needs: DEBUG's static files under daphne, cookies over plain HTTP.
    assert httpx.get(f"{url}/static/rftweb/app.css").status_code == 200
    login = httpx.get(f"{url}/login/")
    assert login.status_code == 200 and "Secure" not in login.headers.get("set-cookie", "")


def test_a_missing_page_is_the_sites_404(served: tuple[str, Path]) -> None:
    url, _ = served
    assert "Page not found" in site_page(httpx.get(f"{url}/no/such/page/"), 404)
    assert "Page not found" in site_page(httpx.get(f"{url}/test-only/missing/"), 404)
    # A slash still added before any 404 (CommonMiddleware runs outside the error pages).
    assert httpx.get(f"{url}/runs").status_code == 301


def test_a_server_error_is_the_sites_500_and_its_traceback_goes_to_the_log(served: tuple[str, Path]) -> None:
    url, log = served
    html = site_page(httpx.get(f"{url}/test-only/fails/"), 500)
    assert "Something went wrong" in html
    assert "a test-only failure" in log.read_text()


@pytest.mark.parametrize(("technical", "shows"), [(False, "Page not found"), (True, "URLconf")])
def test_technical_pages_are_a_developers_choice(client: Client, technical: bool, shows: str) -> None:
    """RFT_TECHNICAL_ERROR_PAGES (a developer's own settings module) gives Django's pages back."""
    with override_settings(DEBUG=True, RFT_TECHNICAL_ERROR_PAGES=technical):
        response = client.get("/no/such/page/")
    assert response.status_code == 404 and shows in response.content.decode()
