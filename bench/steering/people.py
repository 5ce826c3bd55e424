"""The people of the bench: the server they reach (`server_start`, `manage.py runserver` on the
bench database), the scripted `Rater` at its annotation page, who logs in and rates through the
page's own forms, and `RaterSpec`, the preference the careful raters rate by."""

from __future__ import annotations

import html
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import BENCH_DB, ROOT, free_port
from bench.raters import Rating, correct

PASSWORD = "bench-steering-pw"


def server_start(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The web server the raters reach (`manage.py runserver` on the bench database), up."""
    import httpx

    port = free_port()
    env = {**os.environ, "DATABASE_URL": BENCH_DB, "REDIS_URL": "", "RFT_STORAGE_DIR": str(tmp / "storage"),
           "DJANGO_SETTINGS_MODULE": "rftweb.settings", "RFT_FAST_PASSWORD_HASHER": "1"}
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload",
                             "--skip-checks"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(url + "/health/", timeout=2).status_code < 500:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the bench server did not start; see {tmp / 'server.log'}")
        time.sleep(0.3)


ITEM = re.compile(r'<article class="item" id="item-(\d+)" data-assignment="(\d+)" data-experience="(\d+)".*?'
                  r'<pre class="prompt">(.*?)</pre>\s*<div class="completion">(.*?)</div>', re.DOTALL)


class Rater:
    """A person at the annotation page, scripted: logs in through the login form, and rates
    with the forms' own POSTs (CSRF token and session cookie included)."""

    def __init__(self, url: str, username: str, *, careful: bool, seed: int, rating: Rating = correct,
                 noise: float = 0.0) -> None:
        import httpx

        self.url, self.username, self.careful = url, username, careful
        # A careful rater rates by `rating` (bench/raters.py, or --rater's), each rating
        # replaced by a random one with probability `noise`; a careless one rates at random.
        self.rating, self.noise = rating, noise
        self.rng = random.Random(seed)
        self.http = httpx.Client(base_url=url, timeout=60, follow_redirects=False)
        self.http.get("/login/")
        r = self.http.post("/login/", data={"username": username, "password": PASSWORD, "next": "/",
                                            "csrfmiddlewaretoken": self.http.cookies["csrftoken"]})
        if r.status_code != 302:
            raise SystemExit(f"{username} could not log in ({r.status_code})")
        self.labels = 0
        self.retries = 0

    def post(self, path: str, data: dict[str, str]) -> Any:
        # A person whose submit fails (a busy shared database answers 500 now and then) submits
        # again; the services are idempotent per assignment, so nothing is counted twice.
        for attempt in range(6):
            r = self.http.post(path, data={**data, "csrfmiddlewaretoken": self.http.cookies["csrftoken"]},
                               headers={"HX-Request": "true"})
            if r.status_code < 500:
                return r
            self.retries += 1
            time.sleep(0.5 * (attempt + 1))
        return r

    def get(self, path: str) -> Any:
        for attempt in range(6):
            r = self.http.get(path)
            if r.status_code < 500:
                return r
            self.retries += 1
            time.sleep(0.5 * (attempt + 1))
        return r

    def score_for(self, prompt: str, completion: str) -> int:
        if not self.careful:
            return self.rng.randint(1, 5)
        score = self.rating(prompt, completion)
        if self.noise and self.rng.random() < self.noise:
            return self.rng.randint(1, 5)
        return score

    def rate(self, run_id: int, budget: int | None) -> int:
        """Open the annotation page, rate up to `budget` items (None: all), skip the rest."""
        done = 0
        while budget is None or done < budget:
            page = self.get(f"/runs/{run_id}/annotate/")
            page.raise_for_status()
            items = ITEM.findall(page.text)
            if not items:
                break
            for _, assignment, _exp, prompt, completion in items:
                if budget is not None and done >= budget:
                    self.post(f"/runs/{run_id}/annotate/items/{assignment}/skip/", {})
                    continue
                # What a person reads: the rendered completion's text (its markup dropped, the
                # completion's own characters, `<answer>` tags included, unescaped).
                shown = html.unescape(re.sub(r"<[^>]+>", "", completion)).strip()
                score = self.score_for(html.unescape(prompt), shown)
                r = self.post(f"/runs/{run_id}/annotate/items/{assignment}/rate/", {"score": str(score)})
                if r.status_code != 200:
                    raise SystemExit(f"rating failed: {r.status_code} {r.text[:200]}")
                done += 1
        self.labels += done
        return done


@dataclass(frozen=True)
class RaterSpec:
    """A preference the careful raters rate by: its name in the bench's lines, the rating, the
    page's noise (a drawn preference's own level, with --noise beside it) and what it is."""

    name: str
    rating: Rating
    noise: float
    description: str
    mixed: bool  # the preference mixes correctness in (the mixed style + correctness)
