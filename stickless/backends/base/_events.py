"""The bounded, resumable per-session event log and its cursor rules."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from ..._errors import EventCursorAheadError, EventCursorTrimmedError, InvalidRequestError
from ..._events import Event

#: Frames one session's event log keeps (the newest); older ones are dropped.
DEFAULT_EVENT_LOG_MAX_LEN = 10_000
#: Seconds a session's event log lives after its last append or delete (then it is gone whole).
DEFAULT_EVENT_LOG_TTL = 86_400.0


class EventLog(Protocol):
    """Bounded per-session log of event frames, for resuming a stream after a disconnect.

    A log keeps the newest `max_len` frames (exactly) and expires whole `ttl` after its last
    append (or its delete). Ids never go back while the log exists: `delete` empties it but keeps
    its last id until it expires. A cursor is judged against what the log dropped, so a resume
    never silently skips frames:

    - `after=None`, or the origin `'0-0'` (which no log issues as an id), reads from the oldest
      retained frame and never raises: it asks for whatever is held, not to resume;
    - a cursor equal to the last id, or at or after the newest dropped frame, reads on (possibly
      an empty page: nothing new yet);
    - a cursor older than a dropped frame (trimmed by the bound, or deleted with the session)
      raises `EventCursorTrimmedError` naming the oldest retained id (None when empty);
    - a cursor into a log that does not exist (never written, or expired) raises
      `EventCursorTrimmedError` with no ids: whatever followed it is gone;
    - a cursor later than the newest id the log ever gave raises `EventCursorAheadError`;
    - a cursor that is not of the form '<int>-<int>' raises `InvalidRequestError`.
    """

    async def append(self, session_id: str, events: Sequence[Event]) -> list[str]:
        """Append frames in order; return their ids (unique, strictly increasing per session)."""
        ...

    async def read(self, session_id: str, after: str | None, limit: int) -> list[Event]:
        """Up to `limit` frames after the id `after` (from the start when None), `event_id` set.

        Raises:
            EventCursorTrimmedError: frames after `after` were dropped, or the log is gone.
            EventCursorAheadError: `after` is later than every id the log gave.
            InvalidRequestError: `after` is not an event id.
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Drop every frame; the emptied log keeps its last id (so ids never go back and older
        cursors are reported trimmed) until it expires."""
        ...


def event_id_key(event_id: str) -> tuple[int, int]:
    """Sort key of an event id of the form '<int>-<int>' (as Redis stream ids are)."""
    major, _, minor = event_id.partition("-")
    return int(major), int(minor or 0)


_EVENT_ID = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)
_STREAM_ID_LIMIT = 2**64


def parse_event_cursor(cursor: str) -> tuple[int, int]:
    """The (ms, seq) of a resume cursor '<ms>-<seq>' (or '<ms>', meaning seq 0).

    Raises:
        InvalidRequestError: the cursor is not of that form, or a part exceeds 64 bits.
    """
    match = _EVENT_ID.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise InvalidRequestError(f"after: {cursor!r} is not an event id ('<int>-<int>')")
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    if major >= _STREAM_ID_LIMIT or minor >= _STREAM_ID_LIMIT:
        raise InvalidRequestError(f"after: {cursor!r} is out of the event id range")
    return major, minor


def resume_cursor(after: str | None) -> tuple[int, int] | None:
    """The (ms, seq) of a resume cursor, or None to read from the oldest retained frame (for
    `after=None` and for the origin '0-0', which no log issues).

    Raises:
        InvalidRequestError: the cursor is not an event id (see `parse_event_cursor`).
    """
    if after is None:
        return None
    cursor = parse_event_cursor(after)
    return None if cursor == (0, 0) else cursor


def cursor_trimmed(
    session_id: str, cursor: str, oldest_id: str | None, last_id: str | None
) -> EventCursorTrimmedError:
    """The error of a cursor whose successors were dropped (no ids: the whole log is gone)."""
    if last_id is None:
        detail = "the log is gone (expired, or never written): nothing after it can be replayed"
    elif oldest_id is None:
        detail = f"events after it were dropped and none is retained; last id is {last_id}"
    else:
        detail = f"events after it were dropped; oldest retained id is {oldest_id}"
    return EventCursorTrimmedError(
        f"event cursor {cursor} of session {session_id} is trimmed: {detail}",
        session_id=session_id,
        cursor=cursor,
        oldest_id=oldest_id,
        last_id=last_id,
    )


def cursor_ahead(session_id: str, cursor: str, last_id: str) -> EventCursorAheadError:
    """The error of a cursor later than every id the log gave."""
    return EventCursorAheadError(
        f"event cursor {cursor} of session {session_id} is ahead of the log: last id is {last_id}",
        session_id=session_id,
        cursor=cursor,
        last_id=last_id,
    )
