"""Values the router hands back to callers: dispositions, turn lookups and status snapshots."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from .._errors import FailureCode
from .._trace import TraceContext
from .._types import TurnResult


class SubmitKind(enum.StrEnum):
    """Where a submitted turn runs, as seen from the submitting node, or that it does not run."""

    EXECUTED_LOCALLY = "EXECUTED_LOCALLY"
    FORWARDED = "FORWARDED"
    #: The key already holds its answer: nothing runs, `result` is already done.
    CACHED = "CACHED"


class SubmitOrigin(enum.StrEnum):
    """Whether a submit started a turn, followed one still running, or got a stored answer."""

    NEW = "new"
    ATTACHED = "attached"
    CACHED = "cached"


@dataclass(frozen=True, slots=True)
class SubmitDisposition:
    """The answer to `submit`: where the turn runs, its id, and this caller's own result future.

    Cancelling `result` never cancels the turn or other callers' futures.
    """

    kind: SubmitKind
    session_id: str
    turn_id: str
    node_id: str
    result: asyncio.Future[TurnResult]
    message_id: str | None = None
    #: True when the request follows an earlier turn with the same idempotency key that is
    #: still running (`turn_id` is that turn's); False for a new turn or a cached answer.
    attached: bool = False
    #: The submit's span: the turn's trace (its frames name `trace.trace_id`).
    trace: TraceContext | None = None

    @property
    def origin(self) -> SubmitOrigin:
        """New turn, attached to a running one (same idempotency key), or a cached answer."""
        if self.kind is SubmitKind.CACHED:
            return SubmitOrigin.CACHED
        return SubmitOrigin.ATTACHED if self.attached else SubmitOrigin.NEW


class TurnState(enum.StrEnum):
    """Where a turn is, as `router.turn` reads it from the store (see docs, "Turn lookup")."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class TurnInfo(BaseModel):
    """A turn looked up by id, without waiting: its state, the node running it or that ran it
    (or decided its failure), and its result or failure."""

    model_config = ConfigDict(frozen=True)
    session_id: str
    turn_id: str
    state: TurnState
    #: The node running the turn (RUNNING) or that answered it; None while queued.
    executed_by: str | None = None
    #: The attempt running or recorded last (0: none started yet).
    attempt: int = 0
    result: TurnResult | None = None
    failure_code: FailureCode | None = None
    failure_message: str | None = None


class SessionState(enum.StrEnum):
    RUNNING = "RUNNING"
    IDLE = "IDLE"
    GONE = "GONE"
    HELD = "HELD"
    UNHELD = "UNHELD"


class ClusterSessionStatus(BaseModel):
    """Best-effort view of a session across the cluster; never a control gate.

    `pending` and `oldest_pending_idle` are the holder's collected but unanswered messages and
    the store-clock seconds the oldest of them has waited since it was collected (None: none
    pending); `queued` counts the holder's mailbox, not the inbox.
    """

    model_config = ConfigDict(frozen=True)
    session_id: str
    holder: str | None
    token: int | None
    state: SessionState
    active_turn_id: str | None = None
    queued: int = 0
    pending: int = 0
    oldest_pending_idle: float | None = None
    seq: int = 0
    origin: str | None = None
    updated_at: float = 0.0
    observed_by: str = ""
