"""Idempotency reservations: holder, staleness bound and outcome per key."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ...wire import Outcome
from ._records import StagedCommit


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
