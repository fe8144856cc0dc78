"""Node liveness: one expiring key per holder incarnation, on which its leases and held
reservations depend (see "Node liveness" in docs/architecture.md)."""

from __future__ import annotations

from typing import Protocol

#: Seconds a holder's indexes (of its leases and reservations) live after their last write or
#: the holder's last renewal: far longer than a dead holder takes to be swept, so they are
#: there when the sweep comes (and a crashed node's are gone an hour later).
HOLDER_INDEX_TTL = 3600.0


class Liveness(Protocol):
    """One key per holder naming its current incarnation; a lease or held reservation is valid
    only while its holder's key lives and names the incarnation it was taken under."""

    async def register(self, holder: str, incarnation: str, ttl: float) -> None:
        """Start `incarnation` of `holder`, alive for `ttl`: whatever an earlier incarnation
        held is dead from now on (its leases free, its held reservations stale)."""
        ...

    async def renew(self, holder: str, incarnation: str, ttl: float, index_ttl: float) -> bool:
        """Keep `incarnation` alive for `ttl` more (one call, however many sessions it holds),
        and the holder's indexes for `index_ttl`; False when it is no longer alive (expired,
        retired or replaced): it must register anew, holding nothing."""
        ...

    async def retire(self, holder: str, incarnation: str | None = None) -> bool:
        """End the holder's incarnation now (only `incarnation`, when given): its leases are
        free and its held reservations stale at once. True when one was alive."""
        ...

    async def dead_holders(self, limit: int) -> list[str]:
        """Up to `limit` holders whose incarnation ended (or was replaced) since the dead-holder
        sweep last cleared them: their leases and reservations may need cleaning up."""
        ...

    async def forget(self, holder: str) -> None:
        """The dead-holder sweep handled `holder`: drop it unless it is alive again."""
        ...

    async def probe(self) -> None:
        """One round trip to the store over this bundle's connections, touching no data: the
        proof a node's own command path works (see "Node liveness").

        Raises:
            Exception: the store did not answer (the backend's own error).
        """
        ...
