"""Session leases with per-session fencing tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class FencedOut(Exception):
    """A write carried a fencing token older than the session's current one."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A session lease held by `holder`; `token` grows strictly per session."""

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

    async def acquire(self, session_id: str, holder: str, ttl: float) -> Lease | HeldElsewhere:
        """Take the lease if free or expired (new token); the current holder gets its lease back
        with the same token and a refreshed expiry."""
        ...

    async def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """Extend every lease in one round trip; None where the lease was lost (expired and
        taken, released, or a different token)."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the lease up if still held under this token; False when it was not."""
        ...

    async def current(self, session_id: str) -> Lease | None:
        """The unexpired lease on the session, if any."""
        ...

    async def revoke_holder(self, holder: str) -> list[str]:
        """Expire every unexpired lease of `holder` (known dead) now; return their session ids."""
        ...
