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


#: Chunks a stream's reader may hold for a slow client before it waits (then the node's
#: subscriber queue takes the overflow, by its own drop policy).
READ_AHEAD = 4096
_END = b""


async def with_heartbeats(frames: AsyncIterator[bytes], every: float) -> AsyncIterator[bytes]:
    """`frames`, read ahead by a reader task and written in batches: whatever the reader holds
    goes out as one chunk, so a burst costs one write, not one per frame, and the node's
    subscriber queue is drained as fast as frames come. A comment line goes out whenever
    nothing was sent for `every` seconds (idle proxies and browsers keep the connection); the
    first chunk sets the reconnect delay."""
    queue: asyncio.Queue[bytes] = asyncio.Queue(READ_AHEAD)
    failure: list[BaseException] = []

    async def read() -> None:
        try:
            async for chunk in frames:
                if chunk:
                    await queue.put(chunk)
        except Exception as exc:
            failure.append(exc)
        finally:
            await queue.put(_END)

    reader = asyncio.ensure_future(read())
    try:
        yield f"retry: {RECONNECT_MS}\n\n".encode()
        while True:
            try:
                async with asyncio.timeout(every):
                    first = await queue.get()
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            batch = [first]
            while batch[-1] is not _END and not queue.empty():
                batch.append(queue.get_nowait())
            ended = batch[-1] is _END
            if len(batch) > (1 if ended else 0):
                yield b"".join(batch)
            if ended:
                if failure:
                    raise failure[0]
                return
    finally:
        reader.cancel()
        await asyncio.wait({reader})
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()


def sse_response(frames: AsyncIterator[bytes], heartbeat: float) -> StreamingResponse:
    """A 200 event stream of `frames` with heartbeats."""
    return StreamingResponse(
        with_heartbeats(frames, heartbeat), media_type="text/event-stream", headers=SSE_HEADERS
    )
