"""The conductor's beat as a Celery task (autodiscovered as `apps.control.conductor_beat`,
see rftweb/celery.py; apps/control/tasks.py is the dashboard's). Thin: the decisions live in
`apps.control.conductor`; the task is named after this module and its function.
"""

from __future__ import annotations

from apps.control.conductor import conductor_beat
from rftweb.taskkit import celery_task


# Not acked late and never retried: a lost or failed beat is replaced by the next one, a
# fraction of a second later; the beat schedule lets a queued beat expire rather than pile up.
@celery_task(name="apps.control.conductor_beat.conductor_beat_task", ignore_result=True, acks_late=False, time_limit=60,
             soft_time_limit=50)
def conductor_beat_task() -> list[int]:
    return sorted(conductor_beat())
