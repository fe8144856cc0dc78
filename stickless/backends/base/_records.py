"""Session records: agent binding, fence and committed transcript."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..._types import CommittedEntry, TranscriptEntry


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
    turn's outcome (see `HotPath.finish`)."""

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
    only with a turn's outcome, by `HotPath.finish`)."""

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
