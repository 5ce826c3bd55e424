# The Celery app loads with Django so @shared_task binds to it. Where only the API client
# is installed (rftweb.client needs httpx alone) there is no Celery to load.
try:
    from rftweb.celery import app as celery_app
except ModuleNotFoundError as exc:  # pragma: no cover - client-only installs
    if exc.name not in ("celery", "kombu", "django"):
        raise
    celery_app = None

__all__ = ["celery_app"]
