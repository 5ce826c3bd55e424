"""rftweb's settings as they are, with tests/errorpages_urls.py's failing views added."""

from rftweb.settings import *  # noqa: F403

ROOT_URLCONF = "tests.errorpages_urls"
