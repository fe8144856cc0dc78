"""In-memory signal bus: encoded signals fanned out to per-subscription queues on their loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from ..._logs import get_logger
from ...wire import EVENT_CHANNEL_KINDS, Signal, WireError
from ..base import SignalHandler, Subscription
from ._shared import Link, State

logger = get_logger(__name__)


class MemorySubscription:
    """One subscription: an ordered queue on the subscriber's loop drained by one consumer task."""

    def __init__(
        self, state: State, link: Link, handler: SignalHandler, session_id: str | None = None
    ) -> None:
        """Create and register the subscription (caller holds the state lock)."""
        self._link = link
        self._handler = handler
        #: None for the control channel, else the session whose event channel this is.
        self.session_id = session_id
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._closed = False
        self._task = self._loop.create_task(self._consume())
        if self.session_id is None:
            state.control_subs[self] = None
        else:
            state.event_subs.setdefault(self.session_id, {})[self] = None
        self._link.subscriptions[self] = None

    def offer_locked(self, data: bytes) -> None:
        """Queue encoded bytes for the consumer, from any thread (caller holds the state lock)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, data)
        except RuntimeError:  # the subscriber's loop is closed: nobody is listening any more
            self.stop_locked()

    def stop_locked(self) -> None:
        """Stop receiving and let the consumer end (caller holds the state lock)."""
        if self._closed:
            return
        self._closed = True
        state = self._link.state
        if self.session_id is None:
            state.control_subs.pop(self, None)
        else:
            subs = state.event_subs.get(self.session_id, {})
            subs.pop(self, None)
            if not subs:
                state.event_subs.pop(self.session_id, None)
        self._link.subscriptions.pop(self, None)
        with contextlib.suppress(RuntimeError):  # a closed loop took its consumer with it
            self._loop.call_soon_threadsafe(self._queue.put_nowait, None)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop this subscription delivers on."""
        return self._loop

    async def close(self) -> None:
        """Stop delivery; waits for the consumer when called on its loop from another task."""
        with self._link.state.lock:
            self.stop_locked()
        task = self._task
        if task.done() or task is asyncio.current_task():
            return
        if asyncio.get_running_loop() is self._loop:
            task.cancel()
            await asyncio.wait([task])

    async def _consume(self) -> None:
        """Hand queued signals to the handler one at a time; a failing handler is only logged."""
        while True:
            data = await self._queue.get()
            if data is None or self._closed:
                return
            try:
                signal = Signal.decode(data)
            except WireError as exc:
                logger.warning("dropping undecodable signal: %s", exc)
                continue
            try:
                await self._handler(signal)
            except Exception:
                logger.exception(
                    "signal handler failed for %s on session %s", signal.kind, signal.session_id
                )


def fan_out_locked(state: State, data: bytes, session_id: str | None) -> None:
    """Offer bytes to the control subscribers, or to a session's event subscribers."""
    subs = state.control_subs if session_id is None else state.event_subs.get(session_id, {})
    for sub in list(subs):
        sub.offer_locked(data)


class MemorySignalBus:
    """Signals to every subscriber on every link (the publisher's own included), in order."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._events: dict[str, MemorySubscription] = {}

    async def publish(self, signal: Signal) -> None:
        """Send one signal to its channel's subscribers."""
        await self.publish_many([signal])

    async def publish_many(self, signals: Sequence[Signal]) -> None:
        """Send several signals, in order, under one lock hold."""
        encoded = [
            (s.encode(), s.session_id if s.kind in EVENT_CHANNEL_KINDS else None) for s in signals
        ]
        with self._link.open() as state:
            for data, session_id in encoded:
                fan_out_locked(state, data, session_id)

    async def publish_raw(self, data: bytes, session_id: str | None = None) -> None:
        """Test hook: send arbitrary bytes on the control channel (or a session's event channel)."""
        with self._link.open() as state:
            fan_out_locked(state, data, session_id)

    async def subscribe(
        self, handler: SignalHandler, on_resubscribed: Callable[[], None] | None = None
    ) -> Subscription:
        """Receive every control-channel signal on the calling loop (a link never loses a
        subscription it keeps, so `on_resubscribed` is never called)."""
        with self._link.open() as state:
            return MemorySubscription(state, self._link, handler)

    async def subscribe_events(
        self,
        session_id: str,
        handler: SignalHandler,
        on_resubscribed: Callable[[], None] | None = None,
    ) -> None:
        """Receive one session's EVENT signals on the calling loop, replacing a previous handler
        (never lost, so `on_resubscribed` is never called)."""
        with self._link.open() as state:
            previous = self._events.get(session_id)
            if previous is not None:
                previous.stop_locked()
            self._events[session_id] = MemorySubscription(state, self._link, handler, session_id)
        if previous is not None:
            await previous.close()

    async def unsubscribe_events(self, session_id: str) -> None:
        """Stop receiving one session's EVENT signals."""
        with self._link.open():
            sub = self._events.pop(session_id, None)
        if sub is not None:
            await sub.close()
