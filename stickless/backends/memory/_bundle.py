"""The in-memory backends bundle: every role over one shared, thread-safe data set."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from ..._events import Event
from ..base import (
    DEFAULT_EVENT_LOG_MAX_LEN,
    DEFAULT_EVENT_LOG_TTL,
    ChatStreams,
    DeadLetterStore,
    EventLog,
    HotPath,
    IdempotencyStore,
    Inbox,
    LeaseStore,
    Liveness,
    RecordStore,
    SessionOwners,
    SignalBus,
)
from ._dead_letters import MemoryDeadLetterStore
from ._eventlog import MemoryEventLog, relay_batch
from ._hotpath import MemoryHotPath
from ._idempotency import MemoryIdempotencyStore
from ._inbox import MemoryInbox
from ._liveness import MemoryLiveness
from ._shared import Link, State
from ._signals import MemorySignalBus
from ._stores import (
    MemoryChatStreams,
    MemoryLeaseStore,
    MemoryRecordStore,
    MemorySessionOwners,
)


class MemoryBackends:
    """Every storage role in memory; `link()` gives another node its own severable access."""

    # Typed as the roles (not the Memory* classes) so the bundle satisfies `Backends`, whose
    # attributes are settable and therefore invariant.
    leases: LeaseStore
    liveness: Liveness
    records: RecordStore
    inbox: Inbox
    signals: SignalBus
    idempotency: IdempotencyStore
    events: EventLog
    dead_letters: DeadLetterStore
    owners: SessionOwners
    chat_streams: ChatStreams
    hotpath: HotPath

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        max_len: int = DEFAULT_EVENT_LOG_MAX_LEN,
        event_log_ttl: float = DEFAULT_EVENT_LOG_TTL,
    ) -> None:
        """A fresh data set timed by `clock`.

        Each session's event log keeps its newest `max_len` frames and is dropped whole
        `event_log_ttl` seconds (store clock) after its last append or delete, as the Redis
        store does. Records, token counters and reservations follow their own rules (see the
        README section "Redis memory and retention"); dead letters are kept until removed or
        purged; nothing else here expires.
        """
        if max_len < 1:
            raise ValueError("max_len must be at least 1")
        if not event_log_ttl > 0:
            raise ValueError("event_log_ttl must be positive")
        self._attach(Link(State(clock, max_len, event_log_ttl)))

    def _attach(self, link: Link) -> None:
        """Bind every role to `link`."""
        self._link = link
        self.leases = MemoryLeaseStore(link)
        self.liveness = MemoryLiveness(link)
        self.records = MemoryRecordStore(link)
        self.inbox = MemoryInbox(link)
        self.signals = MemorySignalBus(link)
        self.idempotency = MemoryIdempotencyStore(link)
        self.events = MemoryEventLog(link)
        self.dead_letters = MemoryDeadLetterStore(link)
        self.owners = MemorySessionOwners(link)
        self.chat_streams = MemoryChatStreams(link)
        self.hotpath = MemoryHotPath(link)

    async def append_and_publish(
        self, session_id: str, origin: str, batch_id: str, frames: Sequence[Event]
    ) -> list[str]:
        """Log and publish a relay batch in one call (see `EventRelayPath`)."""
        return relay_batch(self._link, session_id, origin, batch_id, frames)

    def link(self) -> MemoryBackends:
        """A new bundle over the same data with its own connection (one per simulated node)."""
        bundle = object.__new__(MemoryBackends)
        bundle._attach(Link(self._link.state))
        return bundle

    def sever(self) -> None:
        """Cut this bundle off (a crash): its operations raise, its subscriptions go quiet."""
        self._link.sever()

    @property
    def severed(self) -> bool:
        """True once `sever()` was called."""
        return self._link.severed

    def watch_answers(self, answered: Callable[[], None]) -> None:
        """Nothing to watch: memory has no path to stall (its probe answers while linked)."""

    async def verify(self) -> tuple[str, ...]:
        """Nothing to check: memory keeps everything until it is removed."""
        return ()

    def clone(self, role: str = "clone") -> MemoryBackends:
        """This bundle itself: memory needs no per-loop connection, and severing cuts both."""
        return self

    async def aclose(self) -> None:
        """Close this link's subscriptions that deliver on the calling loop.

        Other loops' subscriptions are left alone because `clone()` returns this same bundle, so
        a renewal thread closing its clone must not silence the main loop's subscribers.
        """
        loop = asyncio.get_running_loop()
        with self._link.state.lock:
            mine = [sub for sub in self._link.subscriptions if sub.loop is loop]
        for sub in mine:
            await sub.close()
