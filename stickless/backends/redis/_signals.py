"""Redis signal bus: PUBLISH to a shared control channel and per-session event channels; one
pub/sub connection per bundle read by one task that reconnects and resubscribes by itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError

from ..._logs import get_logger
from ...wire import EVENT_CHANNEL_KINDS, Signal, WireError
from ..base import SignalHandler, Subscription
from ._keys import Keys

logger = get_logger(__name__)

#: Reconnect backoff bounds (seconds) of a dropped pub/sub connection.
_BACKOFF_MIN = 0.05
_BACKOFF_MAX = 2.0
#: How long one read waits before the reader checks the connection's health.
_POLL = 1.0
#: Idle time after which the reader PINGs the server to detect a silently dead connection.
_KEEPALIVE = 10.0


class RedisSubscription:
    """One subscription: an ordered queue drained by one consumer task awaiting the handler."""

    def __init__(
        self,
        bus: RedisSignalBus,
        channel: str,
        handler: SignalHandler,
        on_resubscribed: Callable[[], None] | None = None,
    ) -> None:
        self._bus = bus
        self.channel = channel
        self._handler = handler
        #: Called when the channel is confirmed again on a new connection (see `subscribe`).
        self.on_resubscribed = on_resubscribed
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._consume())

    def offer(self, data: bytes) -> None:
        """Queue a received message for the consumer."""
        if not self._closed:
            self._queue.put_nowait(data)

    async def close(self) -> None:
        """Stop delivery (queued messages are dropped) and unsubscribe the channel if unused."""
        await self._bus.detach(self)
        await self.stop()

    async def stop(self) -> None:
        """End the consumer, waiting for it unless called from the consumer itself."""
        if self._closed:
            return
        self._closed = True
        self._queue.put_nowait(None)
        task = self._task
        if not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])

    async def _consume(self) -> None:
        """Hand messages to the handler one at a time; bad bytes and failing handlers are logged."""
        while True:
            data = await self._queue.get()
            if data is None or self._closed:
                return
            try:
                signal = Signal.decode(data)
            except WireError as exc:
                logger.warning("dropping undecodable signal on %s: %s", self.channel, exc)
                continue
            try:
                await self._handler(signal)
            except Exception:
                logger.exception(
                    "signal handler failed for %s on session %s", signal.kind, signal.session_id
                )


class RedisSignalBus:
    """Signals over Redis pub/sub, delivered to every subscribed connection in publish order.

    Subscribing returns once the server confirmed the SUBSCRIBE, so a signal published after
    that is received. The reader task owns the pub/sub connection: when it drops, the reader
    reconnects with backoff and resubscribes every channel that still has subscribers.
    """

    def __init__(
        self, client: Redis, pubsub_client: Redis, keys: Keys, confirm_timeout: float
    ) -> None:
        """Publish through `client`; read pub/sub through `pubsub_client` (its own pool)."""
        self._client = client
        self._pubsub_client = pubsub_client
        self._keys = keys
        self._confirm_timeout = confirm_timeout
        #: Local subscriptions per channel (the pub/sub connection subscribes these channels).
        self._subs: dict[str, dict[RedisSubscription, None]] = {}
        self._events: dict[str, RedisSubscription] = {}
        self._pubsub: PubSub | None = None
        #: Channels subscribed (or being subscribed) on the current connection, and per channel
        #: the SUBSCRIBEs sent and confirmed there (counts survive an UNSUBSCRIBE, so a late
        #: confirmation of an earlier SUBSCRIBE never passes for a newer one).
        self._live: set[str] = set()
        self._sent: dict[str, int] = {}
        self._acked: dict[str, int] = {}
        #: Connections the reader has made; past the first, a confirmation is a resubscription.
        self._connections = 0
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        #: Set by a new subscription to cut the reader's reconnect backoff short.
        self._wake = asyncio.Event()
        self._closed = False

    # ------------------------------------------------------------ publishing

    def _channel(self, signal: Signal) -> str:
        """EVENT signals go to their session's channel, every other kind to the control one."""
        if signal.kind in EVENT_CHANNEL_KINDS:
            return self._keys.event_channel(signal.session_id)
        return self._keys.control_channel

    async def publish(self, signal: Signal) -> None:
        """Send one signal to its channel."""
        await self._client.publish(self._channel(signal), signal.encode())

    async def publish_many(self, signals: Sequence[Signal]) -> None:
        """Send several signals, in order, in one pipelined round trip."""
        if not signals:
            return
        pipe = self._client.pipeline(transaction=False)
        for signal in signals:
            pipe.publish(self._channel(signal), signal.encode())
        await pipe.execute()

    async def publish_raw(self, data: bytes, session_id: str | None = None) -> None:
        """Test hook: send arbitrary bytes on the control channel (or a session's event channel)."""
        channel = (
            self._keys.control_channel
            if session_id is None
            else self._keys.event_channel(session_id)
        )
        await self._client.publish(channel, data)

    # ------------------------------------------------------------ subscribing

    async def subscribe(
        self, handler: SignalHandler, on_resubscribed: Callable[[], None] | None = None
    ) -> Subscription:
        """Receive every control-channel signal on the calling loop; `on_resubscribed` runs
        each time the channel is confirmed on a new connection after a lost one."""
        sub = RedisSubscription(self, self._keys.control_channel, handler, on_resubscribed)
        await self._attach(sub)
        return sub

    async def subscribe_events(
        self,
        session_id: str,
        handler: SignalHandler,
        on_resubscribed: Callable[[], None] | None = None,
    ) -> None:
        """Receive one session's EVENT signals, replacing a previous handler; `on_resubscribed`
        runs each time the channel is confirmed on a new connection after a lost one."""
        channel = self._keys.event_channel(session_id)
        sub = RedisSubscription(self, channel, handler, on_resubscribed)
        previous = self._events.get(session_id)
        self._events[session_id] = sub
        try:
            await self._attach(sub, replacing=previous)
        except BaseException:
            if self._events.get(session_id) is sub:
                del self._events[session_id]
            raise
        finally:
            if previous is not None:
                await previous.stop()

    async def unsubscribe_events(self, session_id: str) -> None:
        """Stop receiving one session's EVENT signals."""
        sub = self._events.pop(session_id, None)
        if sub is not None:
            await sub.close()

    async def _attach(
        self, sub: RedisSubscription, replacing: RedisSubscription | None = None
    ) -> None:
        """Register `sub` (swapping out `replacing` with no gap) and wait for the SUBSCRIBE.

        Raises:
            redis.exceptions.ConnectionError: the bus is closed, or the server did not confirm
                the subscription within the timeout (the subscription is then removed).
        """
        if self._closed:
            await sub.stop()
            raise RedisConnectionError("the signal bus is closed")
        channel = sub.channel
        subs = self._subs.setdefault(channel, {})
        if replacing is not None:
            subs.pop(replacing, None)
        subs[sub] = None
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())
        if self._confirmed(channel):
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(channel, []).append(waiter)
        if self._pubsub is None:
            self._wake.set()
        await self._request(channel)
        try:
            await asyncio.wait_for(waiter, self._confirm_timeout)
        except TimeoutError:
            await sub.close()
            raise RedisConnectionError(
                f"subscription to {channel} not confirmed within {self._confirm_timeout}s"
            ) from None
        finally:
            waiters = self._waiters.get(channel, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(channel, None)

    def _confirmed(self, channel: str) -> bool:
        """True when the current connection confirmed every SUBSCRIBE sent for `channel`."""
        return (
            self._pubsub is not None
            and channel in self._live
            and self._acked.get(channel, 0) >= self._sent.get(channel, 0)
        )

    async def _request(self, channel: str) -> None:
        """SUBSCRIBE on the current connection unless already requested there.

        Without a connection, or when sending fails, the reader subscribes the channel when it
        (re)connects.
        """
        pubsub = self._pubsub
        if pubsub is None or channel in self._live:
            return
        self._live.add(channel)
        self._sent[channel] = self._sent.get(channel, 0) + 1
        try:
            await pubsub.subscribe(channel)
        except Exception as exc:
            logger.debug("SUBSCRIBE %s failed (the reader will retry): %s", channel, exc)

    async def detach(self, sub: RedisSubscription) -> None:
        """Forget `sub`; UNSUBSCRIBE its channel when no local subscription is left on it."""
        subs = self._subs.get(sub.channel)
        if subs is None or sub not in subs:
            return
        del subs[sub]
        if subs:
            return
        del self._subs[sub.channel]
        pubsub = self._pubsub
        if pubsub is not None and sub.channel in self._live:
            self._live.discard(sub.channel)
            try:
                await pubsub.unsubscribe(sub.channel)
            except Exception as exc:
                logger.debug("UNSUBSCRIBE %s failed: %s", sub.channel, exc)

    # ------------------------------------------------------------ reader

    async def _read(self) -> None:
        """Own the pub/sub connection: (re)connect with backoff, resubscribe, dispatch."""
        delay = _BACKOFF_MIN
        failures = 0
        while not self._closed:
            self._wake.clear()
            pubsub = self._pubsub_client.pubsub()
            try:
                await pubsub.ping()
                channels = list(self._subs)
                self._connections += 1
                self._pubsub = pubsub
                self._live = set(channels)
                self._sent = dict.fromkeys(channels, 1)
                self._acked = {}
                if channels:
                    await pubsub.subscribe(*channels)
                delay, failures = _BACKOFF_MIN, 0
                await self._pump(pubsub)
            except Exception as exc:
                failures += 1
                logger.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "pub/sub connection lost (%s: %s); reconnecting in %.2fs (attempt %d)",
                    type(exc).__name__,
                    exc,
                    delay,
                    failures,
                )
            finally:
                self._pubsub = None
                self._live = set()
                self._sent = {}
                self._acked = {}
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _pump(self, pubsub: PubSub) -> None:
        """Dispatch messages until the connection fails (or stops answering PINGs)."""
        loop = asyncio.get_running_loop()
        heard_at = loop.time()
        pinged_at: float | None = None
        # A cancel that lands as redis-py's read timeout fires can be swallowed by it (the read
        # then returns None), so the loop also stops on the closed flag.
        while not self._closed:
            message = await pubsub.get_message(timeout=_POLL)
            now = loop.time()
            if message is None:
                if pinged_at is not None and now - pinged_at > self._confirm_timeout:
                    raise RedisConnectionError("pub/sub connection stopped answering PING")
                if pinged_at is None and now - heard_at > _KEEPALIVE:
                    await pubsub.ping()
                    pinged_at = now
                continue
            heard_at, pinged_at = now, None
            self._dispatch(message)

    def _dispatch(self, message: dict[str, object]) -> None:
        """Route one pub/sub reply: a confirmation wakes waiters, a message feeds subscribers."""
        kind = message.get("type")
        raw_channel = message.get("channel")
        if not isinstance(raw_channel, bytes):
            return
        channel = raw_channel.decode("utf-8", "replace")
        if kind == "subscribe":
            self._acked[channel] = self._acked.get(channel, 0) + 1
            if self._confirmed(channel):
                for waiter in self._waiters.get(channel, []):
                    if not waiter.done():
                        waiter.set_result(None)
                if self._connections > 1 and self._acked[channel] == 1:
                    self._resubscribed(channel)
        elif kind == "message":
            data = message.get("data")
            if isinstance(data, bytes):
                for sub in list(self._subs.get(channel, ())):
                    sub.offer(data)

    def _resubscribed(self, channel: str) -> None:
        """A reconnection confirmed `channel` again: tell its subscriptions (signals sent while
        the connection was down are gone)."""
        for sub in list(self._subs.get(channel, ())):
            if sub.on_resubscribed is not None:
                try:
                    sub.on_resubscribed()
                except Exception:
                    logger.exception("resubscription hook of %s failed", channel)

    # ------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        """Stop the reader and every subscription of this bus."""
        self._closed = True
        reader, self._reader = self._reader, None
        while reader is not None and not reader.done():
            reader.cancel()  # again if a read swallowed it; the closed flag ends the loop anyway
            await asyncio.wait([reader], timeout=_POLL)
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(RedisConnectionError("the signal bus is closed"))
        subs = [sub for channel_subs in self._subs.values() for sub in channel_subs]
        self._subs.clear()
        self._events.clear()
        for sub in subs:
            await sub.stop()
        await self._pubsub_client.aclose()
