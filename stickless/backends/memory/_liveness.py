"""In-memory node liveness: one incarnation per holder, expiring unless renewed."""

from __future__ import annotations

from ._shared import Link, LiveRow, incarnation_of


class MemoryLiveness:
    """Holder -> live incarnation, plus the index the dead-holder sweep reads (as on Redis)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def register(self, holder: str, incarnation: str, ttl: float) -> None:
        """Start the incarnation (replacing any other) and mark the holder for the sweep."""
        with self._link.open() as state:
            state.liveness[holder] = LiveRow(incarnation, state.clock() + ttl)
            state.live_index[holder] = 0.0

    async def renew(self, holder: str, incarnation: str, ttl: float, index_ttl: float) -> bool:
        """Extend the incarnation while it is the live one (the indexes here never expire)."""
        with self._link.open() as state:
            now = state.clock()
            if incarnation_of(state, holder, now) != incarnation:
                return False
            deadline = now + ttl
            state.liveness[holder].expires_at = deadline
            if state.live_index.get(holder, 1.0) > 0:
                state.live_index[holder] = deadline
            return True

    async def retire(self, holder: str, incarnation: str | None = None) -> bool:
        """End the incarnation now (only `incarnation`, when given)."""
        with self._link.open() as state:
            current = incarnation_of(state, holder, state.clock())
            if not current or (incarnation is not None and current != incarnation):
                return False
            del state.liveness[holder]
            state.live_index[holder] = 0.0
            return True

    async def dead_holders(self, limit: int) -> list[str]:
        """Holders scored before now, lowest first."""
        with self._link.open() as state:
            now = state.clock()
            due = sorted((score, h) for h, score in state.live_index.items() if score < now)
            return [holder for _, holder in due[: max(limit, 0)]]

    async def forget(self, holder: str) -> None:
        """Drop a dead holder from the index; a live one is scored at its liveness deadline."""
        with self._link.open() as state:
            now = state.clock()
            score = state.live_index.get(holder)
            if score is None or score >= now:
                return
            if incarnation_of(state, holder, now):
                state.live_index[holder] = state.liveness[holder].expires_at
            else:
                del state.live_index[holder]

    async def probe(self) -> None:
        """Reach the shared state (refused once this link is severed)."""
        with self._link.open():
            return
