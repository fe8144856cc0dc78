"""Storage roles: one Protocol per role (a module each), and the values they exchange.

Every time-based decision (lease expiry, reservation staleness, message age) is taken with the
store's own clock, never the caller's, so nodes with skewed clocks agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from ._chat_streams import ChatStreams
from ._dead_letters import (
    MAX_RAW_BYTES,
    DeadLetter,
    DeadLetterStore,
    check_letter,
    letter_for_envelope,
    letter_for_unreadable,
    letter_id_for,
    letter_session,
    pack_letter,
    stamp_of,
    unpack_letter,
    unreadable_letter,
)
from ._events import (
    DEFAULT_EVENT_LOG_MAX_LEN,
    DEFAULT_EVENT_LOG_TTL,
    EventLog,
    cursor_ahead,
    cursor_trimmed,
    event_id_key,
    parse_event_cursor,
    resume_cursor,
)
from ._hotpath import (
    Finished,
    Forwarded,
    Forwarding,
    HotPath,
    Reserved,
    TurnFrames,
)
from ._idempotency import (
    REJECTED,
    AttemptRecord,
    IdempotencyStore,
    Reservation,
    ReservationState,
    Takeover,
)
from ._inbox import (
    CollectedBatch,
    InboundMessage,
    Inbox,
    PendingStats,
    UnreadableEntry,
    decode_entries,
    sort_messages,
)
from ._leases import (
    FencedOut,
    HeldElsewhere,
    Lease,
    LeaseStore,
    NotLive,
)
from ._liveness import HOLDER_INDEX_TTL, Liveness
from ._owners import SessionOwners
from ._records import (
    MAX_VERSION,
    RecordStore,
    RecordView,
    StagedCommit,
    check_version,
)
from ._relaying import RELAY_BATCH_WINDOW, EventRelayPath, check_batch_id
from ._signals import (
    SignalBus,
    SignalHandler,
    Subscription,
)

__all__ = [
    "HOLDER_INDEX_TTL",
    "MAX_VERSION",
    "MAX_RAW_BYTES",
    "REJECTED",
    "RELAY_BATCH_WINDOW",
    "AttemptRecord",
    "Takeover",
    "Backends",
    "ChatStreams",
    "CollectedBatch",
    "DEFAULT_EVENT_LOG_MAX_LEN",
    "DEFAULT_EVENT_LOG_TTL",
    "DeadLetter",
    "DeadLetterStore",
    "EventLog",
    "EventRelayPath",
    "FencedOut",
    "Finished",
    "Forwarded",
    "Forwarding",
    "HeldElsewhere",
    "HotPath",
    "IdempotencyStore",
    "InboundMessage",
    "Inbox",
    "Lease",
    "LeaseStore",
    "Liveness",
    "NotLive",
    "PendingStats",
    "RecordStore",
    "RecordView",
    "Reserved",
    "TurnFrames",
    "Reservation",
    "ReservationState",
    "SessionOwners",
    "SignalBus",
    "SignalHandler",
    "StagedCommit",
    "check_version",
    "Subscription",
    "UnreadableEntry",
    "check_batch_id",
    "check_letter",
    "cursor_ahead",
    "cursor_trimmed",
    "decode_entries",
    "event_id_key",
    "letter_for_envelope",
    "letter_for_unreadable",
    "letter_id_for",
    "letter_session",
    "pack_letter",
    "parse_event_cursor",
    "resume_cursor",
    "sort_messages",
    "stamp_of",
    "unpack_letter",
    "unreadable_letter",
]


@runtime_checkable
class Backends(EventRelayPath, Protocol):
    """A bundle of every storage role a router needs, and the fused calls that span roles."""

    leases: LeaseStore
    liveness: Liveness
    records: RecordStore
    inbox: Inbox
    signals: SignalBus
    idempotency: IdempotencyStore
    events: EventLog
    dead_letters: DeadLetterStore
    #: Who created each session (the HTTP gateway's authorization stamp).
    owners: SessionOwners
    #: The turn each chat last started (the AI SDK routes' resumable stream).
    chat_streams: ChatStreams
    #: The fused calls of a turn's phases over the roles above (see `HotPath`).
    hotpath: HotPath

    def clone(self, role: str = "clone") -> Backends:
        """A bundle over the same data with its own connections (for another thread's loop),
        named for `role` where the store lists its clients."""
        ...

    def watch_answers(self, answered: Callable[[], None]) -> None:
        """Call `answered` (on the bundle's own event loop) whenever a store call over this
        bundle's connections got the store's answer: proof that its command path works, which
        a busy pool's queue must not hide from the node's path check (see "Node liveness")."""
        ...

    async def verify(self) -> tuple[str, ...]:
        """Check, at a router's start, that the store keeps what stickless's guarantees need;
        the warnings a node should report (logged, counted, shown by `/readyz`).

        Raises:
            StoreMisconfiguredError: the store is set up so that the guarantees cannot hold.
        """
        ...

    async def aclose(self) -> None:
        """Close connections this bundle opened."""
        ...
