"""`router.events(...)`: a live (optionally replayed) stream of a session's event frames."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable

from .._errors import InvalidRequestError
from .._events import Event, is_terminal
from ..actors import Subscriber, drain_subscriber
from ..backends.base import EventLog

_REPLAY_PAGE = 500

#: An event id as both event logs write it (a Redis stream id): "<ms>-<n>", or "<ms>" alone
#: (read as "<ms>-0"), each part an unsigned 64-bit decimal, ASCII digits only.
_EVENT_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")
_U64_MAX = 2**64 - 1


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
        replayed: set[tuple[str, int, int]] = set()
        cursor = self._after
        if cursor is not None:
            while True:
                page = await self._log.read(self._sub.session_id, cursor, _REPLAY_PAGE)
                for frame in page:
                    replayed.add((frame.turn_id, frame.attempt, frame.seq))
                    if turn_filter is not None and frame.turn_id != turn_filter:
                        continue
                    yield frame
                    if turn_filter is not None and is_terminal(frame):
                        return
                if len(page) < _REPLAY_PAGE or page[-1].event_id is None:
                    break
                cursor = page[-1].event_id
        async for frame in drain_subscriber(self._sub):
            if replayed and (frame.turn_id, frame.attempt, frame.seq) in replayed:
                continue
            yield frame
