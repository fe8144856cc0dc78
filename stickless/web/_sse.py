"""Server-sent events: frame encoding, heartbeats and the streaming response (see the README,
"Serve over HTTP")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from .._events import Event

#: Headers of every event stream: never cached, never buffered by a proxy (nginx honours
#: X-Accel-Buffering; haproxy forwards chunks as they come).
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
#: Seconds a browser waits before reconnecting a dropped stream (the `retry:` field).
RECONNECT_MS = 1000


def event_frame(event: Event) -> bytes:
    """One frame as SSE: `id:` the event log id (when it has one), `event:` its type, `data:`
    the frame as one JSON line."""
    head = f"id: {event.event_id}\n" if event.event_id else ""
    return f"{head}event: {event.type}\ndata: {event.model_dump_json()}\n\n".encode()


def named_frame(name: str, data: dict[str, Any]) -> bytes:
    """A frame that is not a turn event (`gap`), without an id so the resume cursor stays."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def gap_frame(cursor: str, oldest_id: str | None) -> bytes:
    """The frames after `cursor` are gone (trimmed or expired): the stream goes on from the
    oldest retained one, and a client resynchronises from the transcript."""
    return named_frame("gap", {"cursor": cursor, "oldest_id": oldest_id})


async def with_heartbeats(frames: AsyncIterator[bytes], every: float) -> AsyncIterator[bytes]:
    """`frames`, with a comment line whenever nothing was sent for `every` seconds, so idle
    proxies and browsers keep the connection; the first chunk sets the reconnect delay."""
    yield f"retry: {RECONNECT_MS}\n\n".encode()
    pending: asyncio.Future[bytes] = asyncio.ensure_future(anext(frames))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield b": keep-alive\n\n"
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            yield chunk
            pending = asyncio.ensure_future(anext(frames))
    finally:
        if not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()


def sse_response(frames: AsyncIterator[bytes], heartbeat: float) -> StreamingResponse:
    """A 200 event stream of `frames` with heartbeats."""
    return StreamingResponse(
        with_heartbeats(frames, heartbeat), media_type="text/event-stream", headers=SSE_HEADERS
    )
