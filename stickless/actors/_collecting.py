"""A session actor's collect: the inbox batch it reads, and the work it admits from it."""

from __future__ import annotations

from .._types import Priority
from ..backends.base import CollectedBatch
from ._host import ActorHost
from ._mailbox import Mailbox
from ._work import PendingEntry, TurnWork


async def fetch_batch(
    host: ActorHost,
    session_id: str,
    max_priority: Priority,
    token: int,
    *,
    lone: bool,
    reclaim_own: bool,
) -> CollectedBatch:
    """The session's next inbox batch under lease `token`; when `lone` (nothing queued or
    running here, a LATER collect), the hot path's take, so a lone message's take-over goes
    with it.

    Raises:
        Exception: whatever the store raised (the batch may be pending under this lease).
    """
    if lone:
        return await host.backends.hotpath.take(
            session_id,
            max_priority,
            token,
            host.node_id,
            host.config.idempotency_secondary_ttl,
            reclaim_own=reclaim_own,
        )
    return await host.backends.inbox.collect(
        session_id, max_priority, token, reclaim_own=reclaim_own
    )


def admitted(
    host: ActorHost, mailbox: Mailbox, batch: CollectedBatch, token: int
) -> list[TurnWork]:
    """The batch's messages as work, minus those the mailbox already has; each marked cancelled
    if an interrupt named it first, and taken over when the collect took it (`taken_attempt`).

    Reservations are taken over when a turn starts, not here (a lone message that starts next is
    taken over by the collect itself): a message that never started stays its submitter's
    (withdrawable) and, pending, a successor's to run.
    """
    kept = []
    for message in batch.messages:
        if not mailbox.admit(message.envelope.turn_id):
            continue
        work = TurnWork.from_envelope(message.envelope, PendingEntry(token, message.message_id))
        work.cancelled = mailbox.cancelled(work.turn_id)
        if batch.taken_attempt:
            host.taken(work, batch.taken_attempt)
        kept.append(work)
    return kept
