"""Storage roles: one Protocol per role, and the values they exchange.

Every time-based decision (lease expiry, reservation staleness, message age) is taken with the
store's own clock, never the caller's, so nodes with skewed clocks agree.
"""

from __future__ import annotations

import enum
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .._errors import EventCursorAheadError, EventCursorTrimmedError, InvalidRequestError
from .._events import Event
from .._types import CommittedEntry, Priority, TranscriptEntry
from ..wire import Envelope, Outcome, Signal, WireError, salvage_addresses

_log = logging.getLogger("stickless.backends")


class FencedOut(Exception):
    """A write carried a fencing token older than the session's current one."""


# --------------------------------------------------------------------------- leases


@dataclass(frozen=True, slots=True)
class Lease:
    """A session lease held by `holder`; `token` grows strictly per session."""

    session_id: str
    holder: str
    token: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class HeldElsewhere:
    """Acquire lost: another node holds the session under `token`."""

    session_id: str
    holder: str
    token: int
    expires_at: float


class LeaseStore(Protocol):
    """Session-lifetime leases with per-session fencing tokens."""

    async def acquire(self, session_id: str, holder: str, ttl: float) -> Lease | HeldElsewhere:
        """Take the lease if free or expired (new token); the current holder gets its lease back
        with the same token and a refreshed expiry."""
        ...

    async def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """Extend every lease in one round trip; None where the lease was lost (expired and
        taken, released, or a different token)."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the lease up if still held under this token; False when it was not."""
        ...

    async def current(self, session_id: str) -> Lease | None:
        """The unexpired lease on the session, if any."""
        ...

    async def revoke_holder(self, holder: str) -> list[str]:
        """Expire every unexpired lease of `holder` (known dead) now; return their session ids."""
        ...


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class RecordView:
    """Read-only view of a session record."""

    session_id: str
    agent_ref: str
    fence: int
    entries: tuple[CommittedEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class StagedCommit:
    """A turn's transcript entries, to be committed under the lease `token` together with the
    turn's outcome (see `IdempotencyStore.mark_done`)."""

    token: int
    entries: tuple[TranscriptEntry, ...]

    def committed(self, turn_id: str) -> list[CommittedEntry]:
        """The entries as stored: tagged with the turn and the token."""
        return [
            CommittedEntry.model_validate(
                {**entry.model_dump(mode="python"), "turn_id": turn_id, "token": self.token}
            )
            for entry in self.entries
        ]


class RecordStore(Protocol):
    """Session records: agent binding, fence and committed transcript (entries are appended
    only with a turn's outcome, by `IdempotencyStore.mark_done`)."""

    async def load(self, session_id: str) -> RecordView | None:
        """The record, or None when the session has none."""
        ...

    async def binding(self, session_id: str) -> str | None:
        """The agent the session is bound to (None without a record); reads no transcript."""
        ...

    async def provision(self, session_id: str, agent_ref: str, token: int) -> str:
        """Create the record bound to `agent_ref` if missing, raise its fence to `token`, and
        return the agent the session is bound to (which may differ from `agent_ref`).

        Raises:
            FencedOut: `token` is older than the record's fence.
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Delete the record and its transcript (the fence counter lives with the lease)."""
        ...


# --------------------------------------------------------------------------- inbox


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


@dataclass(frozen=True, slots=True)
class CollectedBatch:
    """What one collect removed, readable entries sorted priority-then-FIFO."""

    messages: list[InboundMessage] = field(default_factory=list)
    unreadable: list[UnreadableEntry] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.messages or self.unreadable)


def sort_messages(messages: list[InboundMessage]) -> list[InboundMessage]:
    """Priority first, then original enqueue time (kept across re-delivery)."""
    return sorted(messages, key=lambda m: (int(m.envelope.priority), m.envelope.enqueued_at))


def decode_entries(
    session_id: str, entries: Iterable[tuple[str, object, object]]
) -> CollectedBatch:
    """Decode removed inbox entries `(message id, stored bytes, stored arrival time)` one by one.

    The entry is the boundary of a failure: anything wrong with one entry (bytes that are not an
    envelope, an arrival that is missing or not a finite number, a value of the wrong type, any
    exception at all) turns only that entry into an `UnreadableEntry`, addressable by whatever
    turn id and key could be read; this never raises, because the entries are already out of the
    store. Each unreadable entry is logged once (session and entry id, never the payload).
    The arrival time becomes `enqueued_at` of an envelope delivered without one.
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
            unreadable.append(UnreadableEntry(message_id, turn_id, key, reason))
    return CollectedBatch(sort_messages(messages), unreadable)


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
        `token` (after a collect whose reply never arrived). An entry leaves the pending set only
        by `ack` or `purge`, so nothing collected is lost."""
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


# --------------------------------------------------------------------------- signals

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

    async def subscribe_events(self, session_id: str, handler: SignalHandler) -> None:
        """Start receiving EVENT signals of one session (replaces a previous handler)."""
        ...

    async def unsubscribe_events(self, session_id: str) -> None: ...


# --------------------------------------------------------------------------- idempotency


class ReservationState(enum.StrEnum):
    IN_FLIGHT = "IN_FLIGHT"
    DONE = "DONE"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class Reservation:
    """An idempotency reservation, scoped to (session_id, key)."""

    session_id: str
    key: str
    turn_id: str
    input_hash: str
    holder: str | None
    state: ReservationState
    touched_at: float
    #: True when an IN_FLIGHT reservation is past its staleness bound (store clock).
    stale: bool = False
    outcome: Outcome | None = None


class HolderTakeover(enum.Enum):
    WON = "WON"
    REJECTED = "REJECTED"


@dataclass(frozen=True, slots=True)
class ReservationRef:
    """Address of a reservation this node holds (what a renewal tick touches)."""

    session_id: str
    key: str
    holder: str


class IdempotencyStore(Protocol):
    """Per-session idempotency reservations with a holder, a staleness bound and an outcome."""

    async def put_if_absent(
        self,
        session_id: str,
        key: str,
        turn_id: str,
        input_hash: str,
        holder: str,
        secondary_ttl: float,
        primary_ttl: float,
    ) -> Reservation | None:
        """Reserve the key (IN_FLIGHT, held by `holder`); None when created, else the existing
        reservation. A FAILED one, or one past the primary TTL, counts as absent and is replaced.
        The same call made again (same turn and holder) finds its own reservation: None."""
        ...

    async def touch_many(self, refs: Sequence[ReservationRef], secondary_ttl: float) -> None:
        """Push the staleness bound of each IN_FLIGHT reservation still held by its holder."""
        ...

    async def acquire_holder(
        self, session_id: str, key: str, turn_id: str, holder: str, secondary_ttl: float
    ) -> HolderTakeover:
        """Take over a holderless IN_FLIGHT reservation made for `turn_id` (REJECTED otherwise,
        e.g. when a newer attempt with the same key owns it); raising means the outcome is
        unknown. One `holder` already holding it gets WON again, so the call may be retried."""
        ...

    async def release_holder(
        self, session_id: str, key: str, holder: str, forward_ttl: float
    ) -> bool:
        """Make a reservation held by `holder` holderless; stale only after `forward_ttl`."""
        ...

    async def mark_done(
        self,
        session_id: str,
        key: str,
        holder: str,
        outcome: Outcome,
        primary_ttl: float,
        commit: StagedCommit | None = None,
    ) -> bool:
        """Record the outcome (DONE when final, else FAILED) and append `commit`'s entries to
        the session's transcript, as one atomic step, if the reservation is IN_FLIGHT for
        `outcome.turn_id` and held by `holder` or by nobody; False otherwise (nothing written).

        So a turn's entries are committed if and only if its outcome is the reservation's: an
        outcome decided elsewhere first (a holder-loss reset) refuses the commit. Running the
        same call again (a retry after a lost reply) finds its own outcome and returns True
        without writing anything twice.

        Raises:
            FencedOut: `commit.token` is older than the record's fence, or there is no record
                (nothing written).
        """
        ...

    async def compare_and_reset(
        self, session_id: str, key: str, expected_holder: str | None, outcome: Outcome
    ) -> bool:
        """If IN_FLIGHT for `outcome.turn_id` and held by `expected_holder`, mark it FAILED with
        `outcome`; exactly one of several concurrent callers wins, and a newer attempt under the
        same key is never reset by a decision about an older one."""
        ...

    async def discard_reservation(self, session_id: str, key: str, turn_id: str) -> bool:
        """Remove an IN_FLIGHT reservation made for `turn_id` (bad input, unreadable entry)."""
        ...

    async def find_stale_in_flight(self, limit: int) -> list[Reservation]:
        """IN_FLIGHT reservations past their staleness bound (store clock)."""
        ...

    async def expire_holder(self, holder: str) -> int:
        """Make every IN_FLIGHT reservation held by `holder` (known dead) stale now; count them."""
        ...

    async def find(self, session_id: str, key: str) -> Reservation | None: ...


# --------------------------------------------------------------------------- event log


#: Frames one session's event log keeps (the newest); older ones are dropped.
DEFAULT_EVENT_LOG_MAX_LEN = 10_000
#: Seconds a session's event log lives after its last append or delete (then it is gone whole).
DEFAULT_EVENT_LOG_TTL = 86_400.0


class EventLog(Protocol):
    """Bounded per-session log of event frames, for resuming a stream after a disconnect.

    A log keeps the newest `max_len` frames (exactly) and expires whole `ttl` after its last
    append (or its delete). Ids never go back while the log exists: `delete` empties it but keeps
    its last id until it expires. A cursor is judged against what the log dropped, so a resume
    never silently skips frames:

    - `after=None`, or the origin `'0-0'` (which no log issues as an id), reads from the oldest
      retained frame and never raises: it asks for whatever is held, not to resume;
    - a cursor equal to the last id, or at or after the newest dropped frame, reads on (possibly
      an empty page: nothing new yet);
    - a cursor older than a dropped frame (trimmed by the bound, or deleted with the session)
      raises `EventCursorTrimmedError` naming the oldest retained id (None when empty);
    - a cursor into a log that does not exist (never written, or expired) raises
      `EventCursorTrimmedError` with no ids: whatever followed it is gone;
    - a cursor later than the newest id the log ever gave raises `EventCursorAheadError`;
    - a cursor that is not of the form '<int>-<int>' raises `InvalidRequestError`.
    """

    async def append(self, session_id: str, events: Sequence[Event]) -> list[str]:
        """Append frames in order; return their ids (unique, strictly increasing per session)."""
        ...

    async def read(self, session_id: str, after: str | None, limit: int) -> list[Event]:
        """Up to `limit` frames after the id `after` (from the start when None), `event_id` set.

        Raises:
            EventCursorTrimmedError: frames after `after` were dropped, or the log is gone.
            EventCursorAheadError: `after` is later than every id the log gave.
            InvalidRequestError: `after` is not an event id.
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Drop every frame; the emptied log keeps its last id (so ids never go back and older
        cursors are reported trimmed) until it expires."""
        ...


def event_id_key(event_id: str) -> tuple[int, int]:
    """Sort key of an event id of the form '<int>-<int>' (as Redis stream ids are)."""
    major, _, minor = event_id.partition("-")
    return int(major), int(minor or 0)


_EVENT_ID = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)
_STREAM_ID_LIMIT = 2**64


def parse_event_cursor(cursor: str) -> tuple[int, int]:
    """The (ms, seq) of a resume cursor '<ms>-<seq>' (or '<ms>', meaning seq 0).

    Raises:
        InvalidRequestError: the cursor is not of that form, or a part exceeds 64 bits.
    """
    match = _EVENT_ID.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise InvalidRequestError(f"after: {cursor!r} is not an event id ('<int>-<int>')")
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    if major >= _STREAM_ID_LIMIT or minor >= _STREAM_ID_LIMIT:
        raise InvalidRequestError(f"after: {cursor!r} is out of the event id range")
    return major, minor


def resume_cursor(after: str | None) -> tuple[int, int] | None:
    """The (ms, seq) of a resume cursor, or None to read from the oldest retained frame (for
    `after=None` and for the origin '0-0', which no log issues).

    Raises:
        InvalidRequestError: the cursor is not an event id (see `parse_event_cursor`).
    """
    if after is None:
        return None
    cursor = parse_event_cursor(after)
    return None if cursor == (0, 0) else cursor


def cursor_trimmed(
    session_id: str, cursor: str, oldest_id: str | None, last_id: str | None
) -> EventCursorTrimmedError:
    """The error of a cursor whose successors were dropped (no ids: the whole log is gone)."""
    if last_id is None:
        detail = "the log is gone (expired, or never written): nothing after it can be replayed"
    elif oldest_id is None:
        detail = f"events after it were dropped and none is retained; last id is {last_id}"
    else:
        detail = f"events after it were dropped; oldest retained id is {oldest_id}"
    return EventCursorTrimmedError(
        f"event cursor {cursor} of session {session_id} is trimmed: {detail}",
        session_id=session_id,
        cursor=cursor,
        oldest_id=oldest_id,
        last_id=last_id,
    )


def cursor_ahead(session_id: str, cursor: str, last_id: str) -> EventCursorAheadError:
    """The error of a cursor later than every id the log gave."""
    return EventCursorAheadError(
        f"event cursor {cursor} of session {session_id} is ahead of the log: last id is {last_id}",
        session_id=session_id,
        cursor=cursor,
        last_id=last_id,
    )


# --------------------------------------------------------------------------- bundle


@runtime_checkable
class Backends(Protocol):
    """A bundle of every storage role a router needs."""

    leases: LeaseStore
    records: RecordStore
    inbox: Inbox
    signals: SignalBus
    idempotency: IdempotencyStore
    events: EventLog

    def clone(self) -> Backends:
        """A bundle over the same data with its own connections (for another thread's loop)."""
        ...

    async def aclose(self) -> None:
        """Close connections this bundle opened."""
        ...
