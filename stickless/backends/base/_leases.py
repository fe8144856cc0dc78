"""Session leases with per-session fencing tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..._errors import BackendUnavailableError


class NotLive(BackendUnavailableError):
    """The acquiring holder has no live incarnation (never registered, or its liveness lapsed):
    it may hold nothing until it registers again."""


class FencedOut(Exception):
    """A write carried a fencing token older than the session's current one."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A session lease held by `holder`; `token` grows strictly per session; `expires_at` is
    when the holder's liveness would end unless renewed (store clock, as last seen)."""

    session_id: str
    holder: str
    token: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class HeldElsewhere:
    """Acquire lost: another node holds the session under `token`."""

    session_id: str
    holder: str
    token: int
    expires_at: float


class LeaseStore(Protocol):
    """Session-lifetime leases with per-session fencing tokens."""

    async def acquire(self, session_id: str, holder: str) -> Lease | HeldElsewhere:
        """Take the lease if free or its holder's incarnation is dead (new token), under the
        holder's live incarnation; the current holder gets its lease back with the same token.

        Raises:
            NotLive: `holder` has no live incarnation (see `Liveness.register`).
        """
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the lease up if still held under this token; False when it was not."""
        ...

    async def current(self, session_id: str) -> Lease | None:
        """The valid lease on the session (its holder's incarnation alive), if any."""
        ...

    async def revoke_holder(self, holder: str) -> list[str]:
        """Drop every lease of `holder` left by a dead incarnation (a live one's are kept);
        return their session ids."""
        ...
