"""The Redis event log: one capped stream per session, with exact trimming and cursors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from ..._events import Event
from ...wire import (
    decode_event,
    encode_event,
    event_batch_parts,
)
from ..base import (
    RELAY_BATCH_WINDOW,
    check_batch_id,
    cursor_ahead,
    cursor_trimmed,
    resume_cursor,
)
from ._keys import Keys
from ._role import _ms, _Role, _text
from ._scripts import Scripts

# --------------------------------------------------------------------------- event log


class RedisEventLog(_Role):
    """One stream per session, trimmed exactly to `max_len` by the append script, the newest
    dropped id kept as the stream's max-deleted-entry-id; the stream expires `ttl` seconds after
    its last append or delete. Ids are the stream ids (see `EventLog` for cursor rules)."""

    def __init__(
        self, client: Redis, scripts: Scripts, keys: Keys, max_len: int, ttl: float
    ) -> None:
        super().__init__(client, scripts, keys)
        self._max_len = max_len
        self._ttl_ms = _ms(ttl)

    async def append(self, session_id: str, events: Sequence[Event]) -> list[str]:
        """Append frames in order, in one script (trim and expiry included); their ids."""
        if not events:
            return []
        ids = await self._scripts.events_append(
            keys=[self._keys.event_log(session_id)],
            args=[self._max_len, self._ttl_ms, *(encode_event(event) for event in events)],
        )
        return [_text(event_id) for event_id in ids]

    async def append_and_publish(
        self, session_id: str, origin: str, batch_id: str, frames: Sequence[Event]
    ) -> list[str]:
        """Append frames and publish them as one EVENT signal, in one script run at most once
        per batch id (see `EventRelayPath`); their ids."""
        check_batch_id(batch_id)
        if not frames:
            return []
        head, middle = event_batch_parts(session_id, origin, len(frames))
        ids = await self._scripts.events_relay(
            keys=[self._keys.event_log(session_id), self._keys.relay_batches(session_id)],
            args=[
                *self.relay_args(session_id, batch_id),
                head,
                middle,
                *(encode_event(frame) for frame in frames),
            ],
        )
        return [_text(event_id) for event_id in ids]

    def relay_args(self, session_id: str, batch_id: str) -> list[str | int]:
        """The log bound, its TTL (ms), the batch window, `batch_id` and the event channel: the
        first arguments of a relay batch in a script (see the prelude's relay_batch)."""
        channel = self._keys.event_channel(session_id)
        return [self._max_len, self._ttl_ms, RELAY_BATCH_WINDOW, batch_id, channel]

    async def read(self, session_id: str, after: str | None, limit: int) -> list[Event]:
        """Up to `limit` frames with ids strictly after `after` (all when None), ids set.

        Raises:
            EventCursorTrimmedError, EventCursorAheadError, InvalidRequestError: see `EventLog`.
        """
        floor = resume_cursor(after)
        cursor = "" if floor is None else f"{floor[0]}-{floor[1]}"
        if limit <= 0:
            return []
        reply = await self._scripts.events_read(
            keys=[self._keys.event_log(session_id)], args=[self._max_len, cursor, limit]
        )
        code = int(reply[0])
        if code == 1:
            raise cursor_trimmed(session_id, cursor, _text(reply[1]) or None, _text(reply[2]))
        if code == 2:
            raise cursor_ahead(session_id, cursor, _text(reply[1]))
        if code == 3:
            raise cursor_trimmed(session_id, cursor, None, None)
        return [
            decode_event(dict(_pairs(fields))[b"f"], _text(event_id))
            for event_id, fields in reply[1]
        ]

    async def delete(self, session_id: str) -> None:
        """Empty the session's stream, kept (with its last id, expiring `ttl` from now) so ids
        never go back and older cursors read as trimmed."""
        await self._scripts.events_delete(
            keys=[self._keys.event_log(session_id)], args=[self._ttl_ms]
        )


def _pairs(flat: Sequence[Any]) -> list[tuple[Any, Any]]:
    """[f1, v1, f2, v2, ...] as [(f1, v1), (f2, v2), ...]."""
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
