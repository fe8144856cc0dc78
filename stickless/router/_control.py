"""The node's side of the cluster rail: publishing, signal dispatch, per-session event channels."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from .._events import Event
from .._metrics import SUBSCRIBER_DROPS
from .._types import field_errors
from ..backends.base import Subscription, event_id_key
from ..wire import Signal, SignalKind, WireError, frames_from_payload
from ._background import log, quiet
from ._context import NodeContext, RouterPart
from ._stream import EventStream, check_cursor, log_position
from ._subscribers import Subscriber, SubscriberHub

#: A reaction to one control signal; it may raise ValidationError / WireError on a bad payload.
SignalHandler = Callable[[Signal], None]

#: Backoff bounds (seconds) between retries of an event channel's unconfirmed SUBSCRIBE.
_RESUBSCRIBE_MIN = 0.1
_RESUBSCRIBE_MAX = 2.0

#: Kinds a node also acts on when it published them itself.
_OWN_KINDS = frozenset({SignalKind.MESSAGE_ENQUEUED})


class ControlChannel(RouterPart):
    """Publishes this node's signals, dispatches the cluster's to handlers, relays event frames."""

    def __init__(
        self,
        ctx: NodeContext,
    ) -> None:
        super().__init__(ctx)
        self._handlers: Mapping[SignalKind, SignalHandler] = {}
        self._control: Subscription | None = None
        self._hub = SubscriberHub()
        self._event_channels: dict[str, asyncio.Future[None]] = {}
        #: Per session with local subscribers: the newest event id handed to them (or the
        #: log's last id when its channel opened), where a stream that joins now stands.
        self._heard: dict[str, str] = {}

    async def open(
        self, handlers: Mapping[SignalKind, SignalHandler], on_resubscribed: Callable[[], None]
    ) -> None:
        """Subscribe to the control channel; each known signal kind goes to its handler, and
        `on_resubscribed` runs when the channel is back after a lost connection."""
        self._handlers = handlers
        self._control = await self._backends.signals.subscribe(self._on_signal, on_resubscribed)

    async def close(self) -> None:
        """Leave every event channel and the control channel (best effort)."""
        for session_id in list(self._event_channels):
            with contextlib.suppress(Exception):
                await self._backends.signals.unsubscribe_events(session_id)
        self._event_channels.clear()
        if self._control is not None:
            with contextlib.suppress(Exception):
                await self._control.close()

    # ------------------------------------------------------------ publishing

    def signal(self, kind: SignalKind, session_id: str, payload: dict[str, Any]) -> Signal:
        """A signal of this node (published here, or by the store inside a fused call)."""
        return Signal(kind=kind.value, session_id=session_id, origin=self._node_id, payload=payload)

    async def publish(self, kind: SignalKind, session_id: str, payload: dict[str, Any]) -> None:
        await self._backends.signals.publish(self.signal(kind, session_id, payload))

    async def publish_quiet(
        self, kind: SignalKind, session_id: str, payload: dict[str, Any]
    ) -> None:
        await quiet(self.publish(kind, session_id, payload))

    async def publish_signals(self, signals: list[Signal]) -> None:
        """Best-effort publish of prepared signals (its coroutine starts only when run)."""
        await quiet(self._backends.signals.publish_many(signals))

    async def ring_doorbell(self, session_id: str, held_by: str | None) -> None:
        """Tell the cluster the session's inbox has work (for `held_by`, when it is known)."""
        await self.publish_quiet(
            SignalKind.MESSAGE_ENQUEUED, session_id, {"held_by": held_by} if held_by else {}
        )

    async def _on_signal(self, signal: Signal) -> None:
        if self._bg.closed:
            return
        kind = signal.known_kind()
        if kind is None:
            log.warning("dropping signal of unknown kind %r from %s", signal.kind, signal.origin)
            return
        if signal.origin == self._node_id and kind not in _OWN_KINDS:
            return
        handler = self._handlers.get(kind)
        if handler is None:
            return
        try:
            handler(signal)
        except (ValidationError, WireError) as exc:
            # Field names and rules only: a payload's values may quote the conversation.
            why = field_errors(exc, whole="payload") if isinstance(exc, ValidationError) else exc
            log.warning("dropping malformed %s signal from %s: %s", kind, signal.origin, why)

    # ------------------------------------------------------------ event frames

    def stream(self, session_id: str, turn_id: str | None, after: str | None) -> EventStream:
        """A registered subscriber's stream; the session's event channel opens on first use.

        Raises:
            InvalidRequestError: `after` is not an event id (nothing is registered).
        """
        if after is not None:
            check_cursor(after)
        capacity = self._config.subscriber_queue_size
        sub = Subscriber(session_id, turn_id, capacity, start=self._heard.get(session_id))
        self._hub.add(sub)
        ready = self._event_channels.get(session_id)
        if ready is None:
            ready = asyncio.get_running_loop().create_future()
            self._event_channels[session_id] = ready
            self._bg.spawn(self._open_event_channel(session_id, ready), "event-channel")
        return EventStream(sub, self._backends.events, after, ready, self._close_subscriber)

    async def _open_event_channel(self, session_id: str, ready: asyncio.Future[None]) -> None:
        """Subscribe the session's event channel and read where its log stands, together.

        Each time the channel is subscribed again after a lost pub/sub connection, frames
        published meanwhile never came: every local stream of the session then catches up
        from the event log (see `EventStream`). A first SUBSCRIBE that is not confirmed is
        retried while the session has local streams, which catch up once it is.
        """
        subscribed, origin = await asyncio.gather(
            self._subscribe_events(session_id),
            log_position(self._backends.events, session_id),
            return_exceptions=True,
        )
        if isinstance(origin, BaseException):
            log.warning("event log of %s unreadable: its new streams catch up only once they "
                        "passed a frame: %s", session_id, origin)
        elif self._hub.has(session_id):
            self._heard_up_to(session_id, origin)
            for sub in self._hub.of(session_id):
                sub.start = sub.start or origin
        if not ready.done():
            ready.set_result(None)
        if isinstance(subscribed, BaseException):
            log.warning("event channel of %s unavailable (retrying): %s", session_id, subscribed)
            await self._resubscribe_events(session_id, ready)

    async def _subscribe_events(self, session_id: str) -> None:
        await self._backends.signals.subscribe_events(
            session_id, self._on_event_signal, lambda: self._hub.fall_behind(session_id)
        )

    async def _resubscribe_events(self, session_id: str, channel: asyncio.Future[None]) -> None:
        """Retry the channel's SUBSCRIBE with backoff while it is still open (`channel` is
        its entry); once it holds, the session's streams catch up from the log."""
        delay = _RESUBSCRIBE_MIN
        while True:
            await asyncio.sleep(delay)  # (backoff between retries)
            if self._bg.closed or self._event_channels.get(session_id) is not channel:
                return
            try:
                await self._subscribe_events(session_id)
            except Exception as exc:
                log.debug("event channel of %s still unavailable: %s", session_id, exc)
                delay = min(2 * delay, _RESUBSCRIBE_MAX)
                continue
            if self._event_channels.get(session_id) is not channel:  # closed meanwhile
                await quiet(self._backends.signals.unsubscribe_events(session_id))
                return
            self._hub.fall_behind(session_id)
            return

    async def _close_subscriber(self, sub: Subscriber) -> None:
        if sub.dropped:
            self._metrics.emit("on_events_dropped", sub.session_id, sub.dropped, SUBSCRIBER_DROPS)
        if not self._hub.remove(sub):
            return
        self._heard.pop(sub.session_id, None)
        if self._event_channels.pop(sub.session_id, None) is not None:
            await quiet(self._backends.signals.unsubscribe_events(sub.session_id))

    async def _on_event_signal(self, signal: Signal) -> None:
        # This node's own logged frames come this way too: the channel is the one source of
        # logged frames, so a stream's position is never past a frame it has not heard.
        if signal.known_kind() is not SignalKind.EVENT:
            return
        frames, unreadable = frames_from_payload(signal.payload)
        if unreadable:
            log.warning("dropped %d unreadable event frame(s) from %s", unreadable, signal.origin)
        self._hand_out(signal.session_id, frames)

    async def deliver_frames(self, session_id: str, frames: Sequence[Event]) -> None:
        """Log a batch of frames and publish it on the rail as one signal, in one store call
        (assigning event ids); local streams hear it on the session's channel (or from here,
        when the store call failed)."""
        batch = list(frames)
        ids: list[str] | None = None
        try:
            # A fresh batch id per batch: the store runs a call repeated after a lost reply
            # only once, so the log and the rail never carry a batch twice.
            ids = await self._backends.append_and_publish(
                session_id, self._node_id, uuid.uuid4().hex, batch
            )
        except Exception as exc:
            # Neither logged nor published (or unknown): local subscribers still get the
            # frames, without ids.
            log.warning("event relay of %s failed: %s", session_id, exc)
        self.fan_out_logged(session_id, batch, ids)

    def fan_out_logged(
        self, session_id: str, frames: Sequence[Event], ids: Sequence[str] | None
    ) -> None:
        """Frames this node's store call logged and published under `ids` reach its local
        streams on the session's channel, in log order with every other node's; frames whose
        call failed (`ids` None or empty: not logged, or logged under ids never learned) are
        handed to them here, without ids (a copy the channel also brings is skipped by turn,
        attempt and seq).

        Handing logged frames out here instead would let a stream pass them while frames other
        nodes logged before them are still due on a channel that went down: a catch-up past
        the stream's position would then skip those (see docs/architecture.md, "Streams")."""
        if not ids:
            self._hand_out(session_id, list(frames))

    def _hand_out(self, session_id: str, frames: Sequence[Event]) -> None:
        """Give frames to the session's local subscribers, noting the newest event id."""
        if not self._hub.has(session_id):
            return
        self._hub.fan_out(session_id, frames)
        for frame in reversed(frames):  # a batch's ids increase: its last one is its newest
            if frame.event_id is not None:
                self._heard_up_to(session_id, frame.event_id)
                return

    def _heard_up_to(self, session_id: str, event_id: str) -> None:
        heard = self._heard.get(session_id)
        if heard is None or event_id_key(event_id) > event_id_key(heard):
            self._heard[session_id] = event_id

    def finish_subscribers(self, session_id: str | None = None) -> None:
        """End the local streams of one session (or of all sessions)."""
        if session_id is None:
            self._hub.finish_all()
        else:
            self._hub.finish_session(session_id)
