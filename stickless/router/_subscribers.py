"""Node-local stream subscribers: bounded queues fed by the session's event channel, and the
flag that makes a reader catch up from the event log (see docs/architecture.md, "Streams")."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._events import Event


@dataclass(eq=False)
class Subscriber:
    """One local stream's queue: bounded, dropping its oldest frame when full."""

    session_id: str
    turn_id: str | None
    capacity: int
    #: The newest event id handed to this node's streams of the session when this one joined
    #: (or the log's last id when the session's channel opened; None: not known): where the
    #: stream stands until it passes a frame of its own.
    start: str | None = None
    frames: collections.deque[Event] = field(default_factory=collections.deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    dropped: int = 0
    #: Frames due to this stream may be missing from its queue: logged ones were dropped from
    #: it (a slow reader), or never reached this node (its pub/sub connection was lost). The
    #: reader then reads the event log past the last frame it passed before going on.
    behind: bool = False

    def offer(self, frame: Event) -> None:
        if self.finished or (self.turn_id is not None and frame.turn_id != self.turn_id):
            return
        if len(self.frames) >= self.capacity:
            lost = self.frames.popleft()
            self.dropped += 1
            self.behind = self.behind or lost.event_id is not None
        self.frames.append(frame)
        self.wake.set()

    def fall_behind(self) -> None:
        """Frames may have been missed upstream: make the reader catch up from the log."""
        self.behind = True
        self.wake.set()

    def take_behind(self) -> bool:
        """Whether the reader must catch up now (then the flag is cleared)."""
        behind, self.behind = self.behind, False
        return behind

    async def wait(self) -> None:
        """Until a frame is queued, the reader must catch up, or the subscriber finished."""
        while not (self.frames or self.behind or self.finished):
            self.wake.clear()
            await self.wake.wait()

    def finish(self) -> None:
        self.finished = True
        self.wake.set()


class SubscriberHub:
    """Node-local subscribers per session."""

    def __init__(self) -> None:
        self._by_session: dict[str, set[Subscriber]] = {}

    def add(self, subscriber: Subscriber) -> bool:
        """Register; True when it is the session's first local subscriber."""
        subs = self._by_session.setdefault(subscriber.session_id, set())
        subs.add(subscriber)
        return len(subs) == 1

    def remove(self, subscriber: Subscriber) -> bool:
        """Unregister; True when the session has no local subscriber left."""
        subs = self._by_session.get(subscriber.session_id)
        if subs is None:
            return False
        subs.discard(subscriber)
        if not subs:
            del self._by_session[subscriber.session_id]
            return True
        return False

    def has(self, session_id: str) -> bool:
        return session_id in self._by_session

    def of(self, session_id: str) -> tuple[Subscriber, ...]:
        """The session's local subscribers."""
        return tuple(self._by_session.get(session_id, ()))

    def fan_out(self, session_id: str, frames: Sequence[Event]) -> None:
        for sub in self.of(session_id):
            for frame in frames:
                sub.offer(frame)

    def fall_behind(self, session_id: str) -> None:
        """The session's frames may have been missed: every local stream catches up."""
        for sub in self.of(session_id):
            sub.fall_behind()

    def finish_session(self, session_id: str) -> None:
        for sub in self.of(session_id):
            sub.finish()

    def finish_all(self) -> None:
        for session_id in list(self._by_session):
            self.finish_session(session_id)
