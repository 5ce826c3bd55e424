"""A stand-in for the explorer's write path, run as its own process by the page tests:
writes experiences through experience_write, which announces them, as a rollout worker does.

    python -m tests.feedback.worker '{"run_id": 1, "rows": [{...}, ...]}'
    python -m tests.feedback.worker '{"run_id": 1, "event": {"type": "feedback.saved", "payload": {}}}'
    python -m tests.feedback.worker '{"run_id": 1, "events": [{"type": ..., "payload": {}}, ...]}'  (back to back)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    import django

    django.setup()
    from apps.buffer.drafts import ExperienceDraft
    from apps.buffer.services import experience_write
    from apps.runs.events import event_publish

    spec = json.loads(sys.argv[1])
    if "events" in spec:
        asyncio.run(_burst(spec["run_id"], spec["events"]))
        print(json.dumps({"ids": []}))
        return
    if "event" in spec:
        event_publish(run_id=spec["run_id"], type=spec["event"]["type"], payload=spec["event"]["payload"])
        print(json.dumps({"ids": []}))
        return
    drafts = [ExperienceDraft.from_row({"run_id": spec["run_id"], **row}) for row in spec["rows"]]
    result = experience_write(experiences=drafts, announce=True)
    print(json.dumps({"ids": result.ids}))


async def _burst(run_id: int, events: list[dict[str, Any]]) -> None:
    from apps.runs.events import event_publish_async

    for event in events:
        await event_publish_async(run_id=run_id, type=event["type"], payload=event["payload"])


if __name__ == "__main__":
    main()
