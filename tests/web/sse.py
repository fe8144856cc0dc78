"""Reading server-sent events in tests: parse a body, or read a live stream frame by frame."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Frame:
    """One SSE frame: its `id:`, `event:` and `data:` (decoded JSON when it is JSON)."""

    event: str = "message"
    id: str | None = None
    data: Any = None
    comments: list[str] = field(default_factory=list)


def _build(lines: list[str]) -> Frame | None:
    frame = Frame()
    data: list[str] = []
    for line in lines:
        if line.startswith(":"):
            frame.comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            frame.id = value
        elif name == "event":
            frame.event = value
        elif name == "data":
            data.append(value)
    if not data and not frame.comments:
        return None
    if data:
        text = "\n".join(data)
        try:
            frame.data = json.loads(text)
        except json.JSONDecodeError:
            frame.data = text
    return frame


def parse(body: str) -> list[Frame]:
    """Every frame of a whole SSE body (a `retry:`-only block is skipped)."""
    frames = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        frame = _build([line for line in block.split("\n") if line])
        if frame is not None:
            frames.append(frame)
    return frames


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """Frames of a streamed response as they arrive (comments included, as frames without
    data)."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        if line:
            lines.append(line)
            continue
        frame = _build(lines)
        lines = []
        if frame is not None:
            yield frame


def events(parsed: list[Frame]) -> list[Frame]:
    """The frames that carry data (turn events, gap, error), without heartbeats."""
    return [f for f in parsed if f.data is not None]
