"""Framing of the loopback node protocol: a 4-byte big-endian length, then one msgpack map."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from ..wire import MAX_FRAME_BYTES, WireError, pack, unpack

_HEADER = struct.Struct(">I")


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame, or None at a clean end of stream.

    Raises:
        WireError: the frame is oversized or not a msgpack map.
    """
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise WireError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    body = await reader.readexactly(size)
    value = unpack(body)
    if not isinstance(value, dict):
        raise WireError("a frame must be a map")
    return value


def encode_frame(value: dict[str, Any]) -> bytes:
    body = pack(value)
    return _HEADER.pack(len(body)) + body
