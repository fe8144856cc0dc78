"""Scenario `contention`: 8 concurrent writers on one session, stickless forwarding against the
naive alternative without a runtime (a Redis lock around each turn).

- Naive: 8 coroutines in the bench process, each with its own redis-py client, loop: take the
  session's `redis.asyncio.lock.Lock` (non-blocking attempts, exponential backoff from 1 ms to
  32 ms with full jitter), RPUSH one transcript entry, release.
- stickless: 8 coroutines submit to a router in the bench process; the session is held by a
  `stickless node` process, so every turn is forwarded; the agent stages one transcript entry
  (committed by the fenced write).

Rounds of a fixed duration alternate between the two; a fresh session per round.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from ._common import raw_client, redis_router, request
from ._runner import BenchContext
from ._stats import flatten, ratio, summarize, value_spread

TITLE = "Contention: 8 concurrent writers on one session (Redis lock vs stickless forwarding)"
BASELINE = (
    "redis-py Lock around each turn (non-blocking acquire, 1-32 ms jittered exponential "
    "backoff) + RPUSH of the entry, 8 writers"
)
WRITERS = 8
BACKOFF_MIN = 0.001
BACKOFF_MAX = 0.032


async def _lock_round(url: str, namespace: str, duration: float) -> tuple[list[float], list[int]]:
    session = f"{namespace}:lock-session:{random.getrandbits(32)}"
    clients = [raw_client(url) for _ in range(WRITERS)]
    latencies: list[float] = []
    counts = [0] * WRITERS
    stop = time.perf_counter() + duration

    async def writer(index: int) -> None:
        client = clients[index]
        lock = client.lock(f"{session}:lock", timeout=10.0)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            delay = BACKOFF_MIN
            while not await lock.acquire(blocking=False):
                await asyncio.sleep(random.uniform(0, delay))
                delay = min(delay * 2, BACKOFF_MAX)
            try:
                await client.rpush(f"{session}:transcript", f"entry from writer {index}")
            finally:
                await lock.release()
            latencies.append((time.perf_counter() - t0) * 1000)
            counts[index] += 1

    try:
        await asyncio.gather(*(writer(i) for i in range(WRITERS)))
    finally:
        for client in clients:
            await client.aclose()
    return latencies, counts


async def _stickless_round(
    ctx: BenchContext, router: Any, holder: Any, duration: float
) -> tuple[list[float], list[int]]:
    session = ctx.unique("contention-s")
    await holder.client.run(request(session, "commit"))  # the node process holds it
    latencies: list[float] = []
    counts = [0] * WRITERS
    stop = time.perf_counter() + duration

    async def writer(index: int) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await (await router.submit(request(session, "commit"))).result
            latencies.append((time.perf_counter() - t0) * 1000)
            counts[index] += 1

    await asyncio.gather(*(writer(i) for i in range(WRITERS)))
    return latencies, counts


async def run(ctx: BenchContext) -> dict[str, Any]:
    repeats: int = ctx.pick(3, 1)
    duration: float = ctx.pick(4.0, 1.0)
    namespace = ctx.unique("contention")
    holder = await ctx.node(ctx.unique("contention-holder-"), namespace, {})
    lat: dict[str, list[list[float]]] = {"stickless": [], "lock": []}
    rates: dict[str, list[float]] = {"stickless": [], "lock": []}
    fairness: dict[str, list[list[int]]] = {"stickless": [], "lock": []}
    try:
        async with redis_router(ctx.redis_url, namespace, ctx.unique("contention-a-")) as (
            router,
            _,
        ):
            await _lock_round(ctx.redis_url, namespace, 0.3)  # warm-up
            await _stickless_round(ctx, router, holder, 0.3)
            for index in range(repeats):
                order = ["lock", "stickless"] if index % 2 == 0 else ["stickless", "lock"]
                for name in order:
                    if name == "lock":
                        samples, counts = await _lock_round(ctx.redis_url, namespace, duration)
                    else:
                        samples, counts = await _stickless_round(ctx, router, holder, duration)
                    lat[name].append(samples)
                    rates[name].append(len(samples) / duration)
                    fairness[name].append(counts)
                ctx.progress(f"repeat {index + 1}/{repeats} done")
    finally:
        await holder.stop()
    return _report(lat, rates, fairness, repeats, duration)


def _report(
    lat: dict[str, list[list[float]]],
    rates: dict[str, list[float]],
    fairness: dict[str, list[list[int]]],
    repeats: int,
    duration: float,
) -> dict[str, Any]:
    latency = {name: summarize(flatten(groups), groups) for name, groups in lat.items()}
    throughput = {name: value_spread(values) for name, values in rates.items()}
    fair = {
        name: {
            "min_turns_per_writer": min(min(c) for c in counts),
            "max_turns_per_writer": max(max(c) for c in counts),
        }
        for name, counts in fairness.items()
    }
    mine_rate, lock_rate = throughput["stickless"].get("p50"), throughput["lock"].get("p50")
    ratios = {
        "throughput": ratio(mine_rate, lock_rate),
        "p50": ratio(latency["stickless"].get("p50"), latency["lock"].get("p50")),
        "p99": ratio(latency["stickless"].get("p99"), latency["lock"].get("p99")),
    }
    rows: list[list[Any]] = [
        [
            "turns/s, 8 writers on 1 session (median round)",
            mine_rate,
            lock_rate,
            ratios["throughput"],
        ],
    ]
    for q in ("p50", "p95", "p99", "max"):
        mine, base = latency["stickless"].get(q), latency["lock"].get(q)
        rows.append([f"turn latency {q} (ms)", mine, base, ratio(mine, base)])
    rows.append(
        [
            "turns per writer per round, min..max",
            f"{fair['stickless']['min_turns_per_writer']}..{fair['stickless']['max_turns_per_writer']}",
            f"{fair['lock']['min_turns_per_writer']}..{fair['lock']['max_turns_per_writer']}",
            None,
        ]
    )
    notes = [
        f"{repeats} round(s) of {duration}s per contender, alternating; stickless turns are "
        "forwarded to a node process and commit one transcript entry each",
        "the lock path does only the write; stickless also reserves an idempotency key, logs "
        "and relays the turn's events and records the outcome",
    ]
    return {
        "config": {
            "writers": WRITERS,
            "repeats": repeats,
            "round_s": duration,
            "backoff_s": [BACKOFF_MIN, BACKOFF_MAX],
        },
        "results": {
            "latency_ms": latency,
            "turns_per_s": throughput,
            "fairness": fair,
        },
        "ratios": ratios,
        "rows": rows,
        "goals": [],
        "notes": notes,
    }
