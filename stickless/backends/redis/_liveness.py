"""The Redis liveness role: one expiring key per holder and an index for the dead-holder sweep."""

from __future__ import annotations

from ._role import _ms, _num, _Role, _text


class RedisLiveness(_Role):
    """`Keys.liveness(holder)` names the live incarnation; `Keys.live_index` scores each holder
    by its liveness deadline (0 once registered or retired: due for the sweep)."""

    async def register(self, holder: str, incarnation: str, ttl: float) -> None:
        """Start the incarnation (replacing any other) and mark the holder for the sweep."""
        keys = self._keys
        await self._scripts.live_register(
            keys=[keys.liveness(holder), keys.live_index], args=[holder, incarnation, _num(ttl)]
        )

    async def renew(self, holder: str, incarnation: str, ttl: float, index_ttl: float) -> bool:
        """One script: extend the incarnation, its index score and the holder's indexes."""
        keys = self._keys
        reply = await self._scripts.live_renew(
            keys=[
                keys.liveness(holder),
                keys.live_index,
                keys.holder_leases(holder),
                keys.holder_reservations(holder),
            ],
            args=[holder, incarnation, _num(ttl), _ms(index_ttl)],
        )
        return bool(int(reply))

    async def retire(self, holder: str, incarnation: str | None = None) -> bool:
        """Delete the liveness key (if it names `incarnation`, when given)."""
        keys = self._keys
        reply = await self._scripts.live_retire(
            keys=[keys.liveness(holder), keys.live_index], args=[holder, incarnation or ""]
        )
        return bool(int(reply))

    async def dead_holders(self, limit: int) -> list[str]:
        """Holders scored before now in the liveness index."""
        if limit <= 0:
            return []
        reply = await self._scripts.live_dead(keys=[self._keys.live_index], args=[limit])
        return [_text(holder) for holder in reply]

    async def forget(self, holder: str) -> None:
        """Drop a dead holder from the index; a live one is scored at its liveness deadline."""
        await self._scripts.live_forget(keys=[self._keys.live_index], args=[holder])

    async def probe(self) -> None:
        """One PING on a pooled connection (waiting for a free one like any command)."""
        await self._client.ping()
