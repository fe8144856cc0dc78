"""Shared data of the in-memory backends, and the severable links that reach it."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from ..._errors import BackendUnavailableError
from ..._types import Priority
from ..base import AttemptRecord, ReservationState


class LinkedSubscription(Protocol):
    """What the shared state and a link need of a subscription."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def offer_locked(self, data: bytes) -> None: ...

    def stop_locked(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class LeaseRow:
    """A stored lease: valid while its holder's incarnation `incarnation` lives."""

    holder: str
    token: int
    incarnation: str


@dataclass(slots=True)
class LiveRow:
    """A holder's live incarnation and when it ends unless renewed (store clock)."""

    incarnation: str
    expires_at: float


@dataclass(slots=True)
class RecordRow:
    """A stored session record; entries are packed `CommittedEntry` maps."""

    agent_ref: str | None
    fence: int
    entries: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class InboxRow:
    """A stored inbox entry: its id, arrival time (store clock), encoded envelope, and when a
    collect last moved it under a lease (0 while queued)."""

    message_id: str
    arrived_at: float
    data: bytes
    taken_at: float = 0.0


@dataclass(slots=True)
class ReservationRow:
    """A stored idempotency reservation; the outcome is kept as its wire bytes."""

    turn_id: str
    input_hash: str
    holder: str | None
    #: The holder's incarnation when it took the reservation ("" without a holder).
    incarnation: str
    state: ReservationState
    touched_at: float
    stale_at: float
    expires_at: float
    outcome: bytes | None = None
    attempt: int = 0
    history: list[AttemptRecord] = field(default_factory=list)
    #: Message id of the durable copy in the pending set (None: none recorded).
    pending: str | None = None
    #: A scheduled retry is not taken over before this store-clock time.
    due_at: float = 0.0
    #: How the last attempt in the history was given up: "lost" or "retry".
    given: str = ""
    #: (delivery id, message id) of the reserve that queued it for another holder.
    queued_as: tuple[str, str] | None = None
    traceparent: str = ""
    #: The transcript's version after the turn's commit (None: it committed nothing).
    committed_version: int | None = None


class State:
    """Every role's data, guarded by one lock (renewal threads share it with event loops)."""

    def __init__(self, clock: Callable[[], float], max_len: int, event_log_ttl: float) -> None:
        self.lock = threading.Lock()
        self.clock = clock
        self.max_len = max_len
        self.event_log_ttl = event_log_ttl
        self.lease_counters: dict[str, int] = {}
        self.leases: dict[str, LeaseRow] = {}
        #: Per holder, its live incarnation (dropped once past its expiry).
        self.liveness: dict[str, LiveRow] = {}
        #: Per holder, its liveness deadline (0: due for the dead-holder sweep at once).
        self.live_index: dict[str, float] = {}
        self.records: dict[str, RecordRow] = {}
        self.inbox: dict[str, dict[Priority, deque[InboxRow]]] = {}
        #: Per session, per lease token: collected entries not yet acknowledged, by message id.
        self.pending: dict[str, dict[int, dict[str, InboxRow]]] = {}
        self.message_seq = 0
        self.reservations: dict[tuple[str, str], ReservationRow] = {}
        #: Per (session, turn id), the key its reservation was made under and when that entry
        #: expires (the reservation's reserve-time expiry).
        self.turn_keys: dict[tuple[str, str], tuple[str, float]] = {}
        #: Per session, a bounded deque of (event id, encoded frame), oldest first.
        self.event_streams: dict[str, deque[tuple[str, bytes]]] = {}
        #: Last event id per session as (ms, n); kept after delete so ids never go back, until
        #: the whole log expires.
        self.last_event_ids: dict[str, tuple[int, int]] = {}
        #: Newest event id per session that was dropped (trimmed by the bound or deleted).
        self.dropped_event_ids: dict[str, tuple[int, int]] = {}
        #: Expiry (store clock) of each session's log, oldest first: every refresh re-inserts
        #: the session at the end, so expired logs are always at the front.
        self.event_log_expiry: dict[str, float] = {}
        #: Per session, the newest relay batches as (batch id, event ids), oldest first
        #: (`RELAY_BATCH_WINDOW` at most); forgotten with the log.
        self.relay_batches: dict[str, deque[tuple[str, list[str]]]] = {}
        #: Per session, the packed dead letters by letter id (kept until removed or purged).
        self.dead_letters: dict[str, dict[str, bytes]] = {}
        #: Per session, the principal id that created it (see `SessionOwners`).
        self.owners: dict[str, str] = {}
        #: Per session, the turn its chat client last started (see `ChatStreams`).
        self.chat_streams: dict[str, str] = {}
        self.control_subs: dict[LinkedSubscription, None] = {}
        self.event_subs: dict[str, dict[LinkedSubscription, None]] = {}


def incarnation_of(state: State, holder: str, now: float) -> str:
    """The holder's live incarnation ("" when none: an expired one is dropped, as a key TTL
    would)."""
    row = state.liveness.get(holder)
    if row is None:
        return ""
    if row.expires_at <= now:
        del state.liveness[holder]
        return ""
    return row.incarnation


def holder_alive(state: State, holder: str, incarnation: str, now: float) -> bool:
    """True when `holder` is alive as `incarnation`."""
    return bool(incarnation) and incarnation_of(state, holder, now) == incarnation


def live_until(state: State, holder: str, now: float) -> float:
    """When the holder's liveness ends unless renewed (now when it has none)."""
    row = state.liveness.get(holder)
    return now if row is None or row.expires_at <= now else row.expires_at


class Link:
    """One bundle's connection to the shared state; severing it simulates a crashed node."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.severed = False
        #: This link's live subscriptions (guarded by `state.lock`).
        self.subscriptions: dict[LinkedSubscription, None] = {}

    @contextmanager
    def open(self) -> Iterator[State]:
        """Hold the lock over the shared state, refusing when this link is severed."""
        with self.state.lock:
            if self.severed:
                raise BackendUnavailableError("memory backend link is severed")
            yield self.state

    def sever(self) -> None:
        """Cut this link: later operations raise and its subscriptions stop delivering."""
        with self.state.lock:
            self.severed = True
            for sub in list(self.subscriptions):
                sub.stop_locked()
