"""Session records: agent binding, fence and committed transcript."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..._types import CommittedEntry, TranscriptEntry


@dataclass(frozen=True, slots=True)
class RecordView:
    """Read-only view of a session record."""

    session_id: str
    #: The agent the session is bound to; None until an opener accepted one (see `provision`).
    agent_ref: str | None
    fence: int
    #: The committed entries after the version the load asked for (all of them by default).
    entries: tuple[CommittedEntry, ...] = ()
    #: The transcript's committed version: how many entries it holds in all (entries are only
    #: ever appended, so a later version holds every entry of an earlier one, in order).
    version: int = 0


@dataclass(frozen=True, slots=True)
class StagedCommit:
    """A turn's transcript entries, to be committed under the lease `token` together with the
    turn's outcome (see `HotPath.finish`)."""

    token: int
    entries: tuple[TranscriptEntry, ...]
    #: Staged by a turn the user interrupted (see `RouterConfig.commit_partial_on_interrupt`).
    partial: bool = False

    def committed(self, turn_id: str) -> list[CommittedEntry]:
        """The entries as stored: tagged with the turn and the token (and partial)."""
        tags = {"turn_id": turn_id, "token": self.token, "partial": self.partial}
        return [
            CommittedEntry.model_validate({**entry.model_dump(mode="python"), **tags})
            for entry in self.entries
        ]


#: The largest transcript version a read accepts: Redis list indexes are signed 64-bit, and no
#: transcript comes near it (a read past the last version is simply empty).
MAX_VERSION = 2**63 - 1


def check_version(after: int) -> None:
    """Raises: ValueError: `after` is not a transcript version (an int from 0 to MAX_VERSION)."""
    if type(after) is not int or not 0 <= after <= MAX_VERSION:
        shown = repr(after)[:60]
        raise ValueError(
            f"after: must be a transcript version (an int from 0 to {MAX_VERSION}), not {shown}"
        )


class RecordStore(Protocol):
    """Session records: agent binding, fence and committed transcript (entries are appended
    only with a turn's outcome, by `HotPath.finish`)."""

    async def load(self, session_id: str, after: int = 0) -> RecordView | None:
        """The record with the entries committed after version `after` (one consistent
        snapshot: `version` counts them all), or None when the session has none.

        Raises:
            ValueError: `after` is negative.
        """
        ...

    async def binding(self, session_id: str) -> str | None:
        """The agent the session is bound to (None without a record, or while unbound); reads
        no transcript."""
        ...

    async def provision(self, session_id: str, agent_ref: str | None, token: int) -> str | None:
        """Create the record if missing, raise its fence to `token`, and bind it to `agent_ref`
        when one is given and the record is unbound, in one atomic step; return the agent the
        session is bound to (None: unbound; it may differ from `agent_ref`: the first binding
        stays). A holder binds only an agent its opener accepted ("Agent binding" in
        docs/architecture.md), so a refused agent never binds a session.

        Raises:
            FencedOut: `token` is older than the record's fence (nothing written).
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Delete the record and its transcript (the fence counter lives with the lease)."""
        ...
