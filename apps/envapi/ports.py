"""The environment API's port to the workers: the Redis streams a rollout worker writes a
chat reply and its tokens to (apps/envapi/token_stream.py)."""

from __future__ import annotations

from apps.envapi.token_stream import StreamWriter, reply_push

__all__ = ["StreamWriter", "reply_push"]
