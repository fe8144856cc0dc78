"""The contract between a session actor and its node: what it may ask of the node, and why
it is stopped."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._config import RouterConfig
from .._errors import FailureCode
from .._events import Event
from .._session import LiveSession
from .._trace import Tracing
from ..backends.base import Backends, StagedCommit, UnreadableEntry
from ..wire import Outcome
from ._relay import LastFrames
from ._work import TurnWork


class StopReason(enum.Enum):
    """Why an actor stops; decides the interrupt reason and what happens to queued work."""

    RELEASE = "SESSION_RELEASED"
    DELETE = "SESSION_DELETED"
    LEASE_LOST = "LEASE_LOST"
    EVICTED = "SESSION_EVICTED"
    IDLE = "IDLE"
    LRU = "LRU"
    SHUTDOWN = "SYSTEM_SHUTDOWN"

    @property
    def ends_queue(self) -> bool:
        """Release, delete and a peer's EVICT end the session's queue: waiting work is EVICTED."""
        return self in (StopReason.RELEASE, StopReason.DELETE, StopReason.EVICTED)

    @property
    def interrupt_code(self) -> FailureCode:
        """The answer of a turn this stop cuts short: never the user's INTERRUPTED."""
        if self is StopReason.LEASE_LOST:
            return FailureCode.LEASE_LOST
        if self is StopReason.SHUTDOWN:
            return FailureCode.SHUTDOWN
        return FailureCode.EVICTED


@dataclass(frozen=True, slots=True)
class Later:
    """A take-over to ask for again after `wait` seconds (a retry's backoff, or a running
    attempt whose holder may still answer)."""

    wait: float
    #: Held by a holder that may still answer (not a retry's backoff).
    held: bool = False


class ActorHost(Protocol):
    """What a session actor needs from its node supervisor."""

    @property
    def node_id(self) -> str: ...

    @property
    def config(self) -> RouterConfig: ...

    @property
    def backends(self) -> Backends: ...

    @property
    def tracing(self) -> Tracing: ...

    async def open_handle(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession: ...

    async def deliver_frames(self, session_id: str, frames: Sequence[Event]) -> None: ...

    async def complete(
        self,
        work: TurnWork,
        outcome: Outcome,
        commit: StagedCommit | None = None,
        last: LastFrames | None = None,
        frame: Event | None = None,
        bury: str | None = None,
    ) -> Outcome | None:
        """Record and announce (a relayed turn's `last` frames logged in the step that records
        it, or sent just before an outcome decided here is announced; a turn that did not run
        through a relay delivers `frame` there); the outcome announced (None: decided elsewhere
        or unknown). With `bury`, the message goes to the dead letters (for that reason) in the
        step that records its answer.

        Raises:
            FencedOut: `commit` is under a lease older than the record's fence.
        """
        ...

    def answer_unknown(self, turn_ids: Sequence[str]) -> None:
        """Tell this node's callers of these turns that their answer is unknown (FORWARD_TIMEOUT:
        they may retry the key) while recording it goes on."""
        ...

    async def take_over(self, work: TurnWork) -> bool | Later:
        """Take a collected message's reservation over as its turn starts (setting its
        attempt); False when it must not run here (answered, or left to the node that holds
        it), `Later` when it may be taken over later."""
        ...

    def taken(self, work: TurnWork, attempt: int) -> None:
        """A collect took the message's reservation over already (`HotPath.take`), at
        `attempt`: the work runs here as owned."""
        ...

    async def hold(self, work: TurnWork, token: int) -> None:
        """Keep a durable copy of a turn its submitter is about to run (when the policy runs a
        turn again after its holder is lost), so a successor can; sets `work.pending`."""
        ...

    async def schedule_retry(self, work: TurnWork, token: int, reason: str, delay: float) -> bool:
        """Schedule the next attempt of a failed one, durably, `delay` seconds out (the work
        then waits, unowned and pending, to be taken over again); False when it was refused or
        could not be made sure (the attempt is then answered as failed)."""
        ...

    async def answer_unreadable(
        self, session_id: str, entry: UnreadableEntry, token: int
    ) -> None: ...

    async def holds_lease(self, session_id: str, token: int) -> bool:
        """Whether the session is held under `token` and that lease cannot have run out yet
        (checked before a turn starts and before it commits; confirmed with the store when the
        last renewal is too old to be sure)."""
        ...

    def lease_lost(self, session_id: str, token: int) -> None:
        """The actor of `session_id` under lease `token` lost that lease (told once)."""
        ...

    def events_dropped(self, session_id: str, drops: Mapping[str, int]) -> None:
        """A turn's relay dropped frames: their counts by rank name (`DROP_RANKS`)."""
        ...

    def entries_reclaimed(self, session_id: str, redelivered: int, reclaimed: int) -> None:
        """A collect brought back pending entries: `redelivered` from older leases, `reclaimed`
        from this actor's own (see `CollectedBatch`)."""
        ...

    def actor_state_changed(self, session_id: str, token: int) -> None:
        """The actor of `session_id` under lease `token` started or ended a turn or a drain."""
        ...
