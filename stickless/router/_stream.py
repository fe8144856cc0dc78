"""`router.events(...)`: a live (optionally replayed) stream of a session's event frames."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from .._errors import EventCursorError, InvalidRequestError
from .._events import Event, is_terminal
from .._logs import get_logger
from ..backends.base import EventLog, event_id_key
from ._subscribers import Subscriber

_REPLAY_PAGE = 500
#: Backoff bounds (seconds) of a catch-up whose log read failed: about 3 s of retries in all.
_READ_RETRY_MIN = 0.1
_READ_RETRY_MAX = 1.6
log = get_logger(__name__)

#: An event id as both event logs write it (a Redis stream id): "<ms>-<n>", or "<ms>" alone
#: (read as "<ms>-0"), each part an unsigned 64-bit decimal, ASCII digits only.
_EVENT_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")
_U64_MAX = 2**64 - 1
#: The cursor that reads a log from its oldest retained frame (no log issues it as an id).
ORIGIN = "0-0"
#: A cursor past every id a log can give: a read after it is answered with the log's last id.
_PAST_EVERY_ID = f"{_U64_MAX}-{_U64_MAX}"


async def logged_frames(
    log: EventLog, session_id: str, after: str | None
) -> AsyncGenerator[Event, None]:
    """The session's logged frames after the event id `after` (from the oldest when None), read
    page by page.

    Raises:
        the errors of `EventLog.read` (a trimmed, ahead or malformed cursor; the store).
    """
    cursor = after
    while True:
        page = await log.read(session_id, cursor, _REPLAY_PAGE)
        for frame in page:
            yield frame
        if len(page) < _REPLAY_PAGE or page[-1].event_id is None:
            return
        cursor = page[-1].event_id


async def log_position(log: EventLog, session_id: str) -> str:
    """The newest event id the session's log gave (`ORIGIN` when it gave none, or is gone):
    where a stream opened now stands. Read by the cursor rules of `EventLog`: a cursor past
    every id is answered with the log's last id, a cursor into no log with no ids.

    Raises:
        the store's errors.
    """
    try:
        await log.read(session_id, _PAST_EVERY_ID, 1)
    except EventCursorError as exc:  # ahead (the log's last id), or trimmed with no log
        return exc.last_id or ORIGIN
    return ORIGIN


def check_cursor(after: object) -> None:
    """The syntax check of an `after=` cursor (whether the log still holds it is the log's
    business).

    Raises:
        InvalidRequestError: `after` is not an event id.
    """
    match = _EVENT_ID.fullmatch(after) if isinstance(after, str) else None
    if match is None or any(int(part) > _U64_MAX for part in match.groups() if part):
        shown = repr(after)[:60].encode("utf-8", "backslashreplace").decode("utf-8")
        raise InvalidRequestError(
            f"after: must be an event id '<ms>-<n>' (unsigned 64-bit decimals), got {shown}"
        )


@dataclass(frozen=True)
class StreamGap:
    """Frames a stream was due but could not give: those logged after `cursor` (None: where
    the stream stood was not known) that the event log no longer held (its oldest retained id
    then was `oldest_id`; None: it held none, or could not be read)."""

    cursor: str | None
    oldest_id: str | None


class EventStream:
    """Async iterator over a session's frames, registered at creation so nothing after it is missed.

    `after=None` streams live frames only; `after=<event_id>` first replays the event log past that
    id, then continues live, skipping frames already replayed (matched by turn, attempt, seq).
    Whenever frames due to it may have been missed — its queue overflowed, or the node's pub/sub
    connection was lost — it catches up from the event log past the newest event id it passed,
    in order, each frame once; what the log no longer holds is noted as a `StreamGap`.
    """

    def __init__(
        self,
        subscriber: Subscriber,
        log: EventLog,
        after: str | None,
        ready: asyncio.Future[None],
        on_close: Callable[[Subscriber], Awaitable[None]],
    ) -> None:
        self._sub = subscriber
        self._log = log
        self._after = after
        self._ready = ready
        self._on_close = on_close
        self._iterator: AsyncIterator[Event] | None = None
        self._closed = False
        #: The newest event id this stream passed (yielded, or skipped as another turn's).
        self._position = after
        #: Frames at or before this event id are never yielded: the reader had them (its
        #: resume cursor), or they are older than a gap it was told of.
        self._floor = None if after is None else event_id_key(after)
        self._gaps: list[StreamGap] = []

    @property
    def dropped(self) -> int:
        """Frames this subscriber lost because it read too slowly."""
        return self._sub.dropped

    def take_gaps(self) -> list[StreamGap]:
        """The gaps met since the last call (each lies before the next frame yielded)."""
        gaps, self._gaps = self._gaps, []
        return gaps

    async def ready(self) -> None:
        """Wait until the stream also receives frames from other nodes."""
        await asyncio.shield(self._ready)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._iterator is None:
            self._iterator = self._frames()
        try:
            return await self._iterator.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Stop the stream and unregister it."""
        if self._closed:
            return
        self._closed = True
        self._sub.finish()
        await self._on_close(self._sub)

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _frames(self) -> AsyncIterator[Event]:
        await self.ready()
        sub = self._sub
        if self._position is None:
            self._position = sub.start
        seen = _Recent(2 * sub.capacity + _REPLAY_PAGE)
        if self._after is not None:
            async for frame in logged_frames(self._log, sub.session_id, self._after):
                if self._fresh(frame, seen):
                    yield frame
                    if self._ends(frame):
                        return
        while True:
            await sub.wait()
            if sub.take_behind():
                async for frame in self._caught_up(seen):
                    yield frame
                    if self._ends(frame):
                        return
                continue
            if not sub.frames:
                return  # finished, and every queued frame was given
            frame = sub.frames.popleft()
            if self._fresh(frame, seen):
                yield frame
                if self._ends(frame):
                    return

    def _fresh(self, frame: Event, seen: _Recent) -> bool:
        """Pass a frame: True when it is to be yielded (not seen before, past the floor, of the
        stream's turn)."""
        event_id = frame.event_id
        if event_id is not None and self._floor is not None and (
            event_id_key(event_id) <= self._floor
        ):
            return False
        if not seen.add(frame):
            return False
        if event_id is not None and (
            self._position is None or event_id_key(event_id) > event_id_key(self._position)
        ):
            self._position = event_id
        return self._sub.turn_id is None or frame.turn_id == self._sub.turn_id

    def _ends(self, frame: Event) -> bool:
        return self._sub.turn_id is not None and is_terminal(frame)

    async def _caught_up(self, seen: _Recent) -> AsyncIterator[Event]:
        """The frames the log holds past the stream's position that it did not pass yet, in
        order; when the log no longer holds them all, a gap is noted and whatever it still
        holds follows (frames already passed are skipped). A store out of reach is retried
        with backoff for a few seconds, then that is a gap too."""
        session_id = self._sub.session_id
        if self._position is None:
            self._note_gap(None, None, "where the stream stood is not known")
            return
        cursor, delay = self._position, _READ_RETRY_MIN
        while True:
            given = 0
            try:
                async for frame in logged_frames(self._log, session_id, cursor):
                    given += 1
                    seen.keep(given)  # every frame read here is matched once it arrives live
                    if self._fresh(frame, seen):
                        yield frame
                return
            except EventCursorError as exc:  # (never for ORIGIN)
                self._note_gap(self._position, exc.oldest_id, str(exc))
                self._floor = event_id_key(self._position)
                cursor = ORIGIN
            except Exception as exc:
                if delay > _READ_RETRY_MAX:
                    self._note_gap(self._position, None, f"the event log is out of reach: {exc}")
                    return
                await asyncio.sleep(delay)  # (backoff: the store is out of reach)
                delay *= 2
                cursor = ORIGIN if cursor == ORIGIN else self._position

    def _note_gap(self, cursor: str | None, oldest_id: str | None, why: str) -> None:
        self._gaps.append(StreamGap(cursor, oldest_id))
        log.warning("frames of %s after %s are lost to a stream: %s",
                    self._sub.session_id, cursor, why)


class _Recent:
    """The frames (by turn, attempt, seq) a stream yielded lately, at most `capacity`."""

    def __init__(self, capacity: int) -> None:
        self._base = self._capacity = capacity
        self._keys: dict[tuple[str, int, int], None] = {}

    def keep(self, count: int) -> None:
        """Remember at least the last `count` frames beyond the base capacity (a catch-up's,
        whose frames may still arrive live after it)."""
        self._capacity = max(self._capacity, self._base + count)

    def add(self, frame: Event) -> bool:
        """Remember the frame; False when it was seen before."""
        key = (frame.turn_id, frame.attempt, frame.seq)
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self._capacity:
            del self._keys[next(iter(self._keys))]
        return True
