"""`manage.py runserver`: daphne's development server (HTTP and websockets through the ASGI
application, static files as in DEBUG), as when daphne was in INSTALLED_APPS.

daphne is not in INSTALLED_APPS: its app config imports daphne.server, which installs Twisted's
reactor, in every Django process at start (0.2 of django.setup()'s 1.1 CPU-s here: every
Celery worker, every `rft` command); only a serving process needs it. This app is listed before
django.contrib.staticfiles so that this command, not staticfiles' WSGI one, is `runserver`."""

from daphne.management.commands.runserver import Command as Command
