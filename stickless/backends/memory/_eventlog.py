"""The in-memory event log: bounded, expiring per-session logs of encoded frames."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..._events import Event
from ...wire import (
    decode_event,
    encode_event,
    pack_event_batch,
)
from ..base import (
    RELAY_BATCH_WINDOW,
    check_batch_id,
    cursor_ahead,
    cursor_trimmed,
    event_id_key,
    resume_cursor,
)
from ._shared import Link, State
from ._signals import fan_out_locked


def _expire_logs(state: State, now: float) -> None:
    """Forget every event log past its expiry (they sit at the front of the expiry order)."""
    expiry = state.event_log_expiry
    while expiry:
        session_id, expires_at = next(iter(expiry.items()))
        if expires_at > now:
            return
        del expiry[session_id]
        state.event_streams.pop(session_id, None)
        state.last_event_ids.pop(session_id, None)
        state.dropped_event_ids.pop(session_id, None)
        state.relay_batches.pop(session_id, None)


def _refresh_log(state: State, session_id: str, now: float) -> None:
    """Push the session's log expiry to `event_log_ttl` from now (moving it to the back)."""
    state.event_log_expiry.pop(session_id, None)
    state.event_log_expiry[session_id] = now + state.event_log_ttl


def _format_id(key: tuple[int, int]) -> str:
    return f"{key[0]}-{key[1]}"


class MemoryEventLog:
    """Per-session logs of encoded frames with '<ms>-<n>' ids, keeping the newest `max_len`,
    each forgotten whole `event_log_ttl` after its last append or delete (see `EventLog`)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def append(self, session_id: str, events: Sequence[Event]) -> list[str]:
        """Append frames in order and return their ids."""
        encoded = [encode_event(event) for event in events]
        if not encoded:
            return []
        with self._link.open() as state:
            now = state.clock()
            _expire_logs(state, now)
            return _append_locked(state, session_id, encoded, now)

    async def read(self, session_id: str, after: str | None, limit: int) -> list[Event]:
        """Up to `limit` frames with ids strictly after `after` (all when None), ids set.

        Raises:
            EventCursorTrimmedError, EventCursorAheadError, InvalidRequestError: see `EventLog`.
        """
        floor = resume_cursor(after)
        selected: list[tuple[str, bytes]] = []
        with self._link.open() as state:
            _expire_logs(state, state.clock())
            stream = state.event_streams.get(session_id, deque())
            if floor is not None:
                cursor = _format_id(floor)
                last = state.last_event_ids.get(session_id)
                if last is None:
                    raise cursor_trimmed(session_id, cursor, None, None)
                if floor > last:
                    raise cursor_ahead(session_id, cursor, _format_id(last))
                dropped = state.dropped_event_ids.get(session_id)
                if dropped is not None and floor < dropped:
                    oldest = stream[0][0] if stream else None
                    raise cursor_trimmed(session_id, cursor, oldest, _format_id(last))
            for event_id, data in stream:
                if len(selected) >= limit:
                    break
                if floor is None or event_id_key(event_id) > floor:
                    selected.append((event_id, data))
        return [decode_event(data, event_id) for event_id, data in selected]

    async def delete(self, session_id: str) -> None:
        """Drop the session's frames; its last id is kept (the log now expires as a whole
        `event_log_ttl` from now) so ids never go back and older cursors read as trimmed."""
        with self._link.open() as state:
            now = state.clock()
            _expire_logs(state, now)
            last = state.last_event_ids.get(session_id)
            state.event_streams.pop(session_id, None)
            if last is None:
                return
            state.dropped_event_ids[session_id] = last
            _refresh_log(state, session_id, now)


def _append_locked(state: State, session_id: str, encoded: list[bytes], now: float) -> list[str]:
    """Append encoded frames to a live (unexpired) log, trim it to the bound, refresh its
    expiry; their ids (caller holds the state lock)."""
    stream = state.event_streams.get(session_id)
    if stream is None:
        stream = state.event_streams[session_id] = deque()
    ms = int(now * 1000)
    last_ms, last_n = state.last_event_ids.get(session_id, (-1, 0))
    ids: list[str] = []
    for data in encoded:
        last_ms, last_n = (ms, 0) if ms > last_ms else (last_ms, last_n + 1)
        if (last_ms, last_n) == (0, 0):  # '0-0' is the origin cursor, never an id
            last_n = 1
        event_id = f"{last_ms}-{last_n}"
        stream.append((event_id, data))
        ids.append(event_id)
    while len(stream) > state.max_len:
        dropped, _ = stream.popleft()
        state.dropped_event_ids[session_id] = event_id_key(dropped)
    state.last_event_ids[session_id] = (last_ms, last_n)
    _refresh_log(state, session_id, now)
    return ids


def relay_batch(
    link: Link, session_id: str, origin: str, batch_id: str, frames: Sequence[Event]
) -> list[str]:
    """Append a relay batch and publish it as one EVENT signal under one lock hold, at most
    once per batch id among the session's newest `RELAY_BATCH_WINDOW` (see `EventRelayPath`)."""
    check_batch_id(batch_id)
    encoded = [encode_event(frame) for frame in frames]
    if not encoded:
        return []
    with link.open() as state:
        return relay_batch_locked(state, session_id, origin, batch_id, encoded)


def known_batch(state: State, session_id: str, batch_id: str) -> list[str] | None:
    """The ids a relay batch got when it was logged before (caller holds the lock), or None."""
    for known, known_ids in state.relay_batches.get(session_id, ()):
        if known == batch_id:
            return list(known_ids)
    return None


def relay_batch_locked(
    state: State, session_id: str, origin: str, batch_id: str, encoded: list[bytes]
) -> list[str]:
    """`relay_batch` with the state lock held (a turn's finish logs its last frames so)."""
    now = state.clock()
    _expire_logs(state, now)
    known = known_batch(state, session_id, batch_id)
    if known is not None:
        return known
    recent = state.relay_batches.get(session_id)
    if recent is None:
        recent = state.relay_batches[session_id] = deque(maxlen=RELAY_BATCH_WINDOW)
    ids = _append_locked(state, session_id, encoded, now)
    recent.append((batch_id, ids))
    fan_out_locked(state, pack_event_batch(session_id, origin, encoded, ids), session_id)
    return list(ids)
