"""Values the router hands back to callers: dispositions and status snapshots."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from .._types import TurnResult


class SubmitKind(enum.StrEnum):
    """Where a submitted turn runs, as seen from the submitting node, or that it does not run."""

    EXECUTED_LOCALLY = "EXECUTED_LOCALLY"
    FORWARDED = "FORWARDED"
    #: The key already holds its answer: nothing runs, `result` is already done.
    CACHED = "CACHED"


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
