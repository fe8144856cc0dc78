"""Dead letters for tests: the state a turn whose last attempt failed leaves behind."""

from __future__ import annotations

from stickless import FailureCode, SubmitRequest
from stickless.backends.base import AttemptRecord, Backends, DeadLetter, letter_for_envelope
from stickless.wire import Envelope, Outcome

_GONE = "gone-node/0"


async def dead_turn(backends: Backends, request: SubmitRequest, key: str) -> DeadLetter:
    """The state a turn leaves when its last attempt failed: its key's reservation FAILED (by a
    node now gone) and its letter (what the retry path leaves when it gives up)."""
    old_turn = "old-turn"
    idem = backends.idempotency
    assert (
        await idem.put_if_absent(
            request.session_id, key, old_turn, request.input_hash(), _GONE, 30.0, 3600.0
        )
        is None
    )
    failed = Outcome.failure(old_turn, FailureCode.FAILED, "agent raised ValueError", _GONE)
    assert await idem.compare_and_reset(request.session_id, key, _GONE, failed)
    envelope = Envelope(
        session_id=request.session_id,
        turn_id=old_turn,
        agent_ref=request.agent_ref,
        input=request.input,
        key=key,
        origin=_GONE,
    )
    attempts = [AttemptRecord(attempt=1, node=_GONE, error="ValueError", at=1.0)]
    return letter_for_envelope(envelope, "m-1", "last attempt failed", attempts)
