"""Celery-side modules of the runs app; the Celery app autodiscovers this module in every
worker, which connects the heartbeat signal handlers (see apps.runs.heartbeat)."""

from apps.runs import heartbeat  # noqa: F401  (connects the worker signal handlers)
