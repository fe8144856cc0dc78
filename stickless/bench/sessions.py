"""Scenario `sessions`: turns per second on one node holding many sessions, over memory and
over Redis.

One router (a single node) first claims every session with one turn each (the claim rate is
reported), then rounds of a fixed duration spread turns over the first N of them with
min(N, 64) callers; a caller owns the sessions i, i+64, ... and cycles through them, so no two
callers queue on one session except with N=1, where all 64 queue on the same session (its turns
run one at a time). The sizes are measured interleaved, round by round.

Baseline: for Redis, the minimum round trips of a local turn (record load, put_if_absent,
collect, mark_done: raw redis-py, no server-side work) run by the same number of callers; the
scaling column compares each size with N=1 of the same backend.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._config import DeploymentMode, RouterConfig
from ..router import SessionRouter
from ._common import ClientGauge, LogCounter, claim_all, request
from ._runner import BenchContext
from ._stats import ratio, value_spread
from .agent import make_opener
from .turns import RawPath

TITLE = "Many sessions on one node: turns/s with 1, 100, 10k sessions (memory) and Redis"
BASELINE = (
    "Redis: the raw minimum round trips of a local turn with the same callers; both: the same "
    "router with N=1"
)
CALLERS = 64
#: redis-py's asyncio pool defaults to 100 connections and raises MaxConnectionsError past
#: that; 64 concurrent callers on one node need more (see the notes).
POOL_SIZE = 1024


async def _rate(
    turn: Callable[[str], Awaitable[None]], sessions: list[str], duration: float
) -> float:
    """Turns per second over `sessions` for `duration` seconds with min(N, 64) callers."""
    callers = min(len(sessions), CALLERS) if len(sessions) > 1 else CALLERS
    done = 0
    stop = time.perf_counter() + duration

    async def caller(index: int) -> None:
        nonlocal done
        mine = sessions[index::callers] or sessions[:1]
        position = 0
        while time.perf_counter() < stop:
            await turn(mine[position % len(mine)])
            position += 1
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return done / (time.perf_counter() - t0)


def _router_turn(router: SessionRouter) -> Callable[[str], Awaitable[None]]:
    async def one(session_id: str) -> None:
        await (await router.submit(request(session_id))).result

    return one


async def _measure(
    ctx: BenchContext,
    router: SessionRouter,
    label: str,
    sizes: list[int],
    repeats: int,
    duration: float,
    raw: RawPath | None,
) -> dict[str, Any]:
    sessions = [f"{label}-{i}" for i in range(max(sizes))]
    claim_rate = await claim_all(router, sessions, CALLERS)
    ctx.progress(f"{label}: {len(sessions)} sessions claimed ({claim_rate:.0f}/s)")
    rates: dict[str, list[float]] = {str(n): [] for n in sizes}
    raw_rates: list[float] = []
    turn = _router_turn(router)
    for index in range(repeats):
        order = sizes[index % len(sizes) :] + sizes[: index % len(sizes)]
        for n in order:
            rates[str(n)].append(await _rate(turn, sessions[:n], duration))
        if raw is not None:
            raw_rates.append(await _raw_rate(raw, duration))
    result: dict[str, Any] = {
        "claims_per_s": round(claim_rate, 1),
        "held_sessions": len(sessions),
        "turns_per_s": {n: value_spread(values) for n, values in rates.items()},
    }
    if raw is not None:
        result["raw_local_min_per_s"] = value_spread(raw_rates)
    return result


async def _raw_rate(raw: RawPath, duration: float) -> float:
    done = 0
    stop = time.perf_counter() + duration

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await raw.local()
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CALLERS)))
    return done / (time.perf_counter() - t0)


async def _timed_close(router: SessionRouter) -> dict[str, Any]:
    """Graceful aclose of the node holding every session: seconds, and the warnings it logged
    (counted, not printed)."""
    held = len(router.local_sessions())
    with LogCounter() as logged:
        t0 = time.perf_counter()
        await router.aclose(grace=1.0)
        seconds = time.perf_counter() - t0
    return {"sessions": held, "seconds": round(seconds, 3), "warnings": logged.counts}


async def _leases_left(url: str, namespace: str, node_id: str, count: int) -> int:
    """How many of the node's sessions still have a lease held by it (after its aclose)."""
    from ..backends.redis import RedisBackends

    check = RedisBackends.from_url(url, namespace=namespace)
    try:
        held = 0
        for i in range(count):
            lease = await check.leases.current(f"redis-{i}")
            held += lease is not None and lease.holder == node_id
        return held
    finally:
        await check.aclose()


async def run(ctx: BenchContext) -> dict[str, Any]:
    memory_sizes: list[int] = ctx.pick([1, 100, 10_000], [1, 100, 1000])
    redis_sizes: list[int] = ctx.pick([1, 100, 1000], [1, 10, 100])
    repeats: int = ctx.pick(3, 1)
    duration: float = ctx.pick(1.5, 0.5)
    results: dict[str, Any] = {}
    memory = SessionRouter.build(
        config=RouterConfig(max_cached_sessions=2 * max(memory_sizes)), opener=make_opener()
    )
    await memory.start()
    try:
        results["memory"] = await _measure(
            ctx, memory, "mem", memory_sizes, repeats, duration, None
        )
        results["memory"]["aclose"] = await _timed_close(memory)
    finally:
        await memory.aclose(grace=1.0)
    ctx.progress("memory done")
    from ..backends.redis import RedisBackends

    namespace = ctx.unique("sessions")
    raw = RawPath(ctx.redis_url, namespace + ":raw")
    backends = RedisBackends.from_url(ctx.redis_url, namespace=namespace, max_connections=POOL_SIZE)
    router = SessionRouter.build(
        config=RouterConfig(
            node_id=ctx.unique("sessions-node-"),
            mode=DeploymentMode.DISTRIBUTED,
            max_cached_sessions=2 * max(redis_sizes),
        ),
        opener=make_opener(),
        backends=backends,
    )
    await raw.start()
    await router.start()
    try:
        async with ClientGauge(ctx.redis_url) as gauge:
            results["redis"] = await _measure(
                ctx, router, "redis", redis_sizes, repeats, duration, raw
            )
            results["redis"]["aclose"] = await _timed_close(router)
        results["redis"]["peak_connected_clients"] = gauge.peak
        results["redis"]["aclose"]["leases_still_held"] = await _leases_left(
            ctx.redis_url, namespace, router.node_id, max(redis_sizes)
        )
    finally:
        await router.aclose(grace=1.0)
        await backends.aclose()
        await raw.aclose()
    return _report(results, memory_sizes, redis_sizes, repeats, duration)


def _report(
    results: dict[str, Any],
    memory_sizes: list[int],
    redis_sizes: list[int],
    repeats: int,
    duration: float,
) -> dict[str, Any]:
    rows: list[list[Any]] = []
    ratios: dict[str, Any] = {}
    for backend, sizes in (("memory", memory_sizes), ("redis", redis_sizes)):
        data = results[backend]
        one = data["turns_per_s"][str(sizes[0])].get("p50")
        raw = data.get("raw_local_min_per_s", {}).get("p50")
        for n in sizes:
            rate = data["turns_per_s"][str(n)].get("p50")
            ratios[f"{backend}_{n}_vs_1"] = ratio(rate, one)
            if raw is not None:
                ratios[f"{backend}_{n}_vs_raw"] = ratio(rate, raw)
            rows.append(
                [
                    f"{backend} turns/s, {n} session(s) ({ratios[f'{backend}_{n}_vs_1']}x N=1)",
                    rate,
                    raw if raw is not None else "-",
                    ratio(rate, raw) if raw is not None else None,
                ]
            )
        rows.append(
            [f"{backend} new-session claims/s (first turn)", data["claims_per_s"], "-", None]
        )
        close = data["aclose"]
        rows.append(
            [
                f"{backend} graceful aclose of {close['sessions']:,} idle sessions (s)",
                close["seconds"],
                "-",
                None,
            ]
        )
        failed = sum(close["warnings"].values())
        if failed:
            rows.append([f"  {backend} warnings logged during that aclose", failed, "-", None])
        if "leases_still_held" in close:
            rows.append(
                [
                    f"  {backend} leases still held after that aclose",
                    close["leases_still_held"],
                    0,
                    None,
                ]
            )
    notes = [
        f"{repeats} round(s) of {duration}s per size, interleaved; callers = min(N, {CALLERS}) "
        f"(N=1: {CALLERS} callers queue on one session); the node holds the largest N sessions "
        "throughout, N of them get turns",
        "baseline column (Redis): raw minimum round trips of a local turn by the same callers",
        f"the Redis router's pool is raised to max_connections={POOL_SIZE}: with redis-py's "
        "default (100, raising MaxConnectionsError when exhausted) 64 concurrent callers on one "
        "node fail with BackendUnavailableError; peak connected clients during the Redis part "
        f"(including the graceful aclose): {results['redis'].get('peak_connected_clients')}",
    ]
    for backend in ("memory", "redis"):
        for message, count in results[backend]["aclose"]["warnings"].items():
            notes.append(f"{backend} aclose logged {count} x {message!r}")
    return {
        "config": {
            "memory_sizes": memory_sizes,
            "redis_sizes": redis_sizes,
            "repeats": repeats,
            "round_s": duration,
            "callers": CALLERS,
        },
        "results": results,
        "ratios": ratios,
        "rows": rows,
        "goals": [],
        "notes": notes,
    }
