"""The turn each chat last started through the AI SDK routes, so a client reconnecting to any
node finds the stream to resume (see docs/architecture.md, "AI SDK routes")."""

from __future__ import annotations

from typing import Protocol


class ChatStreams(Protocol):
    """One turn id per session: the turn its chat client last started.

    A pointer, not a control: whoever reads it asks the turn's own reservation whether it still
    runs, so a pointer to a finished, failed or forgotten turn only means "nothing to resume".
    Every call is idempotent; the last `started` wins.
    """

    async def started(self, session_id: str, turn_id: str) -> None:
        """Record `turn_id` as the session's chat stream (kept as long as an event log: the
        stream cannot be replayed after that)."""
        ...

    async def current(self, session_id: str) -> str | None:
        """The turn last recorded for the session, or None (never, or expired)."""
        ...
