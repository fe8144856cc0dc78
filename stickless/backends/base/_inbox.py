"""The per-session inbox and the decoding of its entries."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..._logs import get_logger
from ..._types import Priority
from ...wire import Envelope, WireError, salvage_addresses

_log = get_logger("stickless.backends")


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A decoded inbox entry."""

    message_id: str
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class UnreadableEntry:
    """An inbox entry that could not be decoded; addresses are raw strings when salvageable."""

    message_id: str
    turn_id: str | None
    idempotency_key: str | None
    reason: str
    #: The stored bytes (None when the entry's payload is gone), for the dead letters.
    raw: bytes | None = None


@dataclass(frozen=True, slots=True)
class CollectedBatch:
    """What one collect removed, readable entries sorted priority-then-FIFO, and how many of
    them (readable or not) came out of the pending set instead of the queue."""

    messages: list[InboundMessage] = field(default_factory=list)
    unreadable: list[UnreadableEntry] = field(default_factory=list)
    #: Entries taken over from older leases: a previous holder collected them, never answered.
    redelivered: int = 0
    #: Entries taken back under the collecting lease itself (`reclaim_own`, a collect in doubt).
    reclaimed: int = 0
    #: The attempt at which a take (`HotPath.take`) took the reservation of the batch's only
    #: message over for its taker (0: not taken).
    taken_attempt: int = 0

    def __bool__(self) -> bool:
        return bool(self.messages or self.unreadable)


@dataclass(frozen=True, slots=True)
class PendingStats:
    """One session's inbox backlog: queued (not collected) entries, pending (collected, not
    acknowledged) entries, and the store-clock seconds since the oldest pending one was last
    moved under a lease (None when nothing is pending)."""

    queued: int = 0
    pending: int = 0
    oldest_idle: float | None = None


def sort_messages(messages: list[InboundMessage]) -> list[InboundMessage]:
    """Priority first, then original enqueue time (kept across re-delivery)."""
    return sorted(messages, key=lambda m: (int(m.envelope.priority), m.envelope.enqueued_at))


def decode_entries(
    session_id: str,
    entries: Iterable[tuple[str, object, object]],
    *,
    redelivered: int = 0,
    reclaimed: int = 0,
) -> CollectedBatch:
    """Decode removed inbox entries `(message id, stored bytes, stored arrival time)` one by one.

    The entry is the boundary of a failure: anything wrong with one entry (bytes that are not an
    envelope, an arrival that is missing or not a finite number, a value of the wrong type, any
    exception at all) turns only that entry into an `UnreadableEntry`, addressable by whatever
    turn id and key could be read; this never raises, because the entries are already out of the
    store. Each unreadable entry is logged once (session and entry id, never the payload).
    The arrival time becomes `enqueued_at` of an envelope delivered without one; the counts of
    entries that came out of the pending set are the store's, passed through.
    """
    messages: list[InboundMessage] = []
    unreadable: list[UnreadableEntry] = []
    for message_id, data, arrived in entries:
        try:
            messages.append(InboundMessage(message_id, _decode_entry(data, arrived)))
        except Exception as exc:  # the entry is the boundary: nothing escapes the batch
            reason = (
                str(exc)
                if isinstance(exc, WireError)
                else f"undecodable entry: {type(exc).__name__}"
            )
            _log.warning(
                "unreadable inbox entry %s of session %s: %s", message_id, session_id, reason
            )
            turn_id, key = _salvage(data)
            raw = bytes(data) if isinstance(data, bytes | bytearray | memoryview) else None
            unreadable.append(UnreadableEntry(message_id, turn_id, key, reason, raw))
    return CollectedBatch(sort_messages(messages), unreadable, redelivered, reclaimed)


def _decode_entry(data: object, arrived: object) -> Envelope:
    """One stored entry as an envelope stamped with its arrival time.

    Raises:
        WireError: (or anything else) the entry is not a readable message.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"entry data is {type(data).__name__}, not bytes")
    envelope = Envelope.decode(bytes(data))
    if not math.isfinite(envelope.enqueued_at):
        raise WireError("envelope enqueue time is not a finite number")
    arrival = _arrival(arrived)
    if envelope.enqueued_at == 0:
        envelope = envelope.model_copy(update={"enqueued_at": arrival})
    return envelope


def _arrival(value: object) -> float:
    """A stored arrival time (a number, or its text as bytes or str) as a finite float.

    Raises:
        WireError: the value is missing, of another type, or not a finite number.
    """
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("ascii", errors="replace")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise WireError(f"arrival time is {type(value).__name__}, not a number")
    try:
        seconds = float(value)
    except ValueError:
        raise WireError("arrival time is not a number") from None
    if not math.isfinite(seconds):
        raise WireError("arrival time is not a finite number")
    return seconds


def _salvage(data: object) -> tuple[str | None, str | None]:
    """Best-effort addresses of an unreadable entry; (None, None) when even that fails."""
    try:
        if isinstance(data, bytes | bytearray | memoryview):
            return salvage_addresses(bytes(data))
    except Exception:  # salvage is best effort: an unreadable entry stays answerable by id
        pass
    return None, None


class Inbox(Protocol):
    """Per-session shared queue: any node delivers, the lease holder collects."""

    async def deliver(self, envelope: Envelope, delivery_id: str | None = None) -> str:
        """Append a message (stamping `enqueued_at` with the store clock when it is 0); returns
        its message id. Calls with one `delivery_id` append it once (a caller that does not
        know whether a delivery went through sends it again with the same id)."""
        ...

    async def collect(
        self, session_id: str, max_priority: Priority, token: int, *, reclaim_own: bool = False
    ) -> CollectedBatch:
        """Atomically move every entry of tiers <= `max_priority` into the session's pending
        set under lease `token` and return them, decoded per entry. A full collect (`max_priority`
        LATER) also returns, moved under `token`, the pending entries of older leases (a holder
        that stopped before acknowledging them) and, with `reclaim_own`, those already under
        `token` (after a collect whose reply never arrived); the batch counts both kinds
        (`redelivered`, `reclaimed`). Every entry moved is stamped with the store clock (its
        pending idle time starts again). An entry leaves the pending set only by `ack` or
        `purge`, so nothing collected is lost."""
        ...

    async def ack(self, session_id: str, token: int, message_ids: Sequence[str]) -> None:
        """Drop answered entries from the pending set (ids not pending under `token`: no-op)."""
        ...

    async def is_empty(self, session_id: str) -> bool:
        """True when nothing is queued or pending for the session."""
        ...

    async def purge(self, session_id: str) -> CollectedBatch:
        """Remove everything queued or pending for the session and return what was removed."""
        ...

    async def pending_sessions(self, older_than: float) -> list[str]:
        """Sessions with a message queued for more than `older_than` seconds (store clock)."""
        ...

    async def pending_stats(self, session_ids: Sequence[str]) -> dict[str, PendingStats]:
        """The backlog of each session (every id answered, empty ones with zeros), in one store
        round trip however many sessions are asked for."""
        ...
