"""Logging filters named in rftweb/settings.py's LOGGING."""

from __future__ import annotations

import logging

# The RFT core's loop beat (apps/control/conductor_beat.py) runs every RFT_CONDUCT_SECONDS (0.5 s by
# default): at INFO, Celery writes a line when beat sends it and two more when the worker
# receives it and when it succeeds, about six lines a second that say nothing. What the beat
# does (a step dispatched or sent again) is logged by apps.control.conductor itself.
QUIET_TASKS = frozenset({"apps.control.conductor_beat.conductor_beat_task"})


class LoopBeatQuiet(logging.Filter):
    """Drops Celery's INFO lines about the loop's beat task; warnings and errors pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO or not record.name.startswith("celery"):
            return True
        data = getattr(record, "data", None)  # the worker's "received" / "succeeded" lines
        if isinstance(data, dict) and data.get("name") in QUIET_TASKS:
            return False
        args = record.args
        if isinstance(args, dict):
            return args.get("name") not in QUIET_TASKS
        # beat's "Sending due task <entry> (<task name>)"
        return not (isinstance(args, tuple) and any(isinstance(a, str) and a in QUIET_TASKS for a in args))


class RefusalOneLine(logging.Filter):
    """Django logs each refused request (a PermissionDenied: 403) at WARNING with the
    exception's whole traceback: a page someone may not see is no fault of the code, and a
    crawler's walk of forbidden pages buried the log in tracebacks. The line stays (what was
    refused, where), the traceback goes; 5xx keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500 and record.exc_info:
            record.exc_info = None
            record.exc_text = None
        return True
