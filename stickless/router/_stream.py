"""`router.events(...)`: a live (optionally replayed) stream of a session's event frames."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from .._errors import EventCursorError, InvalidRequestError
from .._events import Event, is_terminal
from .._logs import get_logger
from ..actors import Subscriber, drain_subscriber
from ..backends.base import EventLog

_REPLAY_PAGE = 500
log = get_logger(__name__)

#: An event id as both event logs write it (a Redis stream id): "<ms>-<n>", or "<ms>" alone
#: (read as "<ms>-0"), each part an unsigned 64-bit decimal, ASCII digits only.
_EVENT_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")
_U64_MAX = 2**64 - 1


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


class EventStream:
    """Async iterator over a session's frames, registered at creation so nothing after it is missed.

    `after=None` streams live frames only; `after=<event_id>` first replays the event log past that
    id, then continues live, skipping frames already replayed (matched by turn, attempt, seq).
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

    @property
    def dropped(self) -> int:
        """Frames this subscriber lost because it read too slowly."""
        return self._sub.dropped

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
        turn_filter = self._sub.turn_id
        seen = _Recent(2 * self._sub.capacity + _REPLAY_PAGE)
        cursor = self._after
        if cursor is not None:
            async for frame in logged_frames(self._log, self._sub.session_id, cursor):
                seen.add(frame)
                if turn_filter is not None and frame.turn_id != turn_filter:
                    continue
                yield frame
                if turn_filter is not None and is_terminal(frame):
                    return
        async for frame in drain_subscriber(self._sub):
            lost = self._sub.take_lost()
            if lost is not None:
                # Frames were dropped while this reader lagged: the log still has them (from
                # the oldest dropped one on), so they are yielded in order, and the queued
                # frames the log also gave are skipped below.
                async for old in self._lost_frames(lost):
                    if not seen.add(old) or (turn_filter and old.turn_id != turn_filter):
                        continue
                    yield old
                    if turn_filter is not None and is_terminal(old):
                        return
            if seen.add(frame):
                yield frame

    async def _lost_frames(self, lost_from: str) -> AsyncIterator[Event]:
        """The log's frames from the event id `lost_from` on; none when the log no longer
        holds them (then they are lost: the reader was slower than the log's bound)."""
        try:
            async for frame in logged_frames(
                self._log, self._sub.session_id, _just_before(lost_from)
            ):
                yield frame
        except (EventCursorError, InvalidRequestError) as exc:
            log.warning("frames of %s lost by a slow reader: %s", self._sub.session_id, exc)
        except Exception as exc:  # the store is out of reach: the queue goes on without them
            log.warning("frames of %s lost by a slow reader were not read: %s",
                        self._sub.session_id, exc)


def _just_before(event_id: str) -> str:
    """The id right before `event_id` ("<ms>-<n>"), so a read after it starts at `event_id`."""
    ms, _, n = event_id.partition("-")
    if n and int(n) > 0:
        return f"{ms}-{int(n) - 1}"
    return f"{int(ms) - 1}-{_U64_MAX}" if int(ms) > 0 else "0-0"


class _Recent:
    """The frames (by turn, attempt, seq) a stream yielded lately, at most `capacity`."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._keys: dict[tuple[str, int, int], None] = {}

    def add(self, frame: Event) -> bool:
        """Remember the frame; False when it was seen before."""
        key = (frame.turn_id, frame.attempt, frame.seq)
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self._capacity:
            del self._keys[next(iter(self._keys))]
        return True
