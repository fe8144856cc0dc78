"""Who created each session: the stamp the HTTP gateway authorizes every later call against."""

from __future__ import annotations

from typing import Protocol


class SessionOwners(Protocol):
    """One principal id per session, set once by the first claim and kept until forgotten.

    Every call is idempotent, so a call repeated after a lost reply has the same effect.
    """

    async def claim(self, session_id: str, principal_id: str) -> str:
        """Stamp the session with `principal_id` unless it has an owner; return its owner (the
        claimer when this or an earlier claim of the same principal stamped it)."""
        ...

    async def owner(self, session_id: str) -> str | None:
        """The session's owner, or None when nobody claimed it (or it was forgotten)."""
        ...

    async def forget(self, session_id: str) -> None:
        """Drop the stamp (the session was deleted): the next claim stamps it anew."""
        ...
