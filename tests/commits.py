"""Committing a turn's transcript entries the way a holder does: with the turn's outcome, on
the turn's own reservation, in one store call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stickless import TranscriptEntry
from stickless.backends.base import Backends, StagedCommit
from stickless.wire import Outcome

COMMITTER = "committer"


async def commit_turn(
    backends: Backends,
    session_id: str,
    token: int,
    turn_id: str,
    entries: Sequence[TranscriptEntry],
) -> None:
    """Reserve a key for `turn_id`, then record its success with `entries` under `token`.

    Raises:
        FencedOut: the token is older than the record's fence (nothing written).
    """
    key = f"commit:{turn_id}"
    idem = backends.idempotency
    assert await idem.put_if_absent(session_id, key, turn_id, "h", COMMITTER, 60.0, 3600.0) is None
    done = Outcome(turn_id=turn_id, ok=True, executed_by=COMMITTER)
    commit = StagedCommit(token, tuple(entries))
    assert await mark_done(backends, session_id, key, COMMITTER, done, 3600.0, commit)


async def mark_done(backends: Backends, *args: Any, **kwargs: Any) -> bool:
    """Record a turn's outcome with the holder's fused finish (`HotPath.finish`, same
    arguments), acknowledging and announcing nothing: True when it was recorded."""
    return (await backends.hotpath.finish(*args, **kwargs)).recorded
