"""Test helpers for node liveness: keep a holder alive, end it, and take leases as it."""

from __future__ import annotations

import uuid

from stickless.backends.base import Backends, HeldElsewhere, Lease, NotLive

#: Long enough never to run out during a test.
LONG = 600.0

#: The incarnation each helper-registered holder runs, per shared data set.
_incarnations: dict[tuple[str, str], str] = {}


def _store(backends: Backends) -> str:
    """What identifies the data a bundle reaches (clones and links share it)."""
    keys = getattr(backends, "keys", None)
    if keys is not None:
        return f"redis:{keys.namespace}"
    link = backends._link
    return f"memory:{id(link.state)}"


async def live(backends: Backends, holder: str, ttl: float = LONG) -> str:
    """Keep `holder` alive for `ttl` from now (its known incarnation renewed, else a new one
    registered); its incarnation."""
    known = _incarnations.get((_store(backends), holder))
    if known is not None and await backends.liveness.renew(holder, known, ttl, max(ttl, LONG)):
        return known
    incarnation = uuid.uuid4().hex
    await backends.liveness.register(holder, incarnation, ttl)
    _incarnations[(_store(backends), holder)] = incarnation
    return incarnation


async def kill(backends: Backends, holder: str) -> None:
    """End `holder`'s incarnation now (as a crash would once its liveness ran out)."""
    await backends.liveness.retire(holder)
    _incarnations.pop((_store(backends), holder), None)


async def acquire_lease(
    backends: Backends, session_id: str, holder: str, ttl: float = LONG
) -> Lease | HeldElsewhere:
    """Acquire as `holder`, kept alive for `ttl` (as the per-lease TTL of old did)."""
    await live(backends, holder, ttl)
    try:
        return await backends.leases.acquire(session_id, holder)
    except NotLive:  # ran out between the two calls (a tiny ttl)
        await live(backends, holder, ttl)
        return await backends.leases.acquire(session_id, holder)
