"""Cross-node signals: the control channel and per-session event channels."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from ...wire import Signal

SignalHandler = Callable[[Signal], Awaitable[None]]


class Subscription(Protocol):
    """A live subscription; `close` stops delivery."""

    async def close(self) -> None: ...


class SignalBus(Protocol):
    """At-least-once cross-node signals: a shared control channel, per-session event channels."""

    async def publish(self, signal: Signal) -> None: ...

    async def publish_many(self, signals: Sequence[Signal]) -> None:
        """Publish several signals in one round trip, in order."""
        ...

    async def subscribe(
        self, handler: SignalHandler, on_resubscribed: Callable[[], None] | None = None
    ) -> Subscription:
        """Receive every control-channel signal (all kinds but EVENT). `on_resubscribed` is
        called each time the subscription is live again after its connection was lost: signals
        sent meanwhile were missed, and whatever waits on one should look for itself."""
        ...

    async def subscribe_events(
        self,
        session_id: str,
        handler: SignalHandler,
        on_resubscribed: Callable[[], None] | None = None,
    ) -> None:
        """Start receiving EVENT signals of one session (replaces a previous handler).
        `on_resubscribed` is called each time the channel is live again after its connection
        was lost: frames published meanwhile were missed (the event log has them)."""
        ...

    async def unsubscribe_events(self, session_id: str) -> None: ...
