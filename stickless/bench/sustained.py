"""Scenario `sustained`: one node over Redis under sustained load: many sessions, many callers
each picking a session at random, for a fixed time.

One router in the bench process (a DISTRIBUTED node over the run's Redis, default pool) claims
every session with one turn each, then `callers` concurrent callers submit echo turns to
sessions drawn uniformly at random (two callers may queue on one session) for `duration`
seconds. Reported: turns/s, latency percentiles, failed turns, and Redis's own accounting over
the timed window: `INFO commandstats` deltas per turn (every command executed, those run inside
scripts included) and redis-server CPU per turn. A short MONITOR sample of the same load after
the timed window (MONITOR slows everything: never open while timing) splits the commands into
sent by clients (scripts by name) and run inside scripts.

Baseline: the fused local floor (`_floors`: submit + finish no-op scripts of the fused shape,
2 round trips) run by the same number of callers, for a short window before and after the
timed one.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ._common import CommandTally, claim_all, raw_client, redis_router, request
from ._floors import FLOOR_LOCAL_STEPS, FusedFloor
from ._runner import BenchContext
from ._stats import ratio, summarize

TITLE = "Sustained load on one node over Redis: many sessions, random callers, commandstats"
BASELINE = (
    "the fused local floor (submit + finish no-op scripts of the fused shape, raw redis-py) "
    "run by the same callers before and after the timed window"
)
#: Commands listed per turn (the most called first).
TOP = 10

TurnFn = Callable[[str], Awaitable[None]]


class Load:
    """What one window of load did: latencies of the turns that finished, failures by type."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.failed: dict[str, int] = {}
        self.seconds = 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


async def _load(turn: TurnFn, sessions: list[str], callers: int, duration: float) -> Load:
    """`callers` concurrent callers, each submitting to random sessions for `duration` s."""
    load = Load()
    stop = time.perf_counter() + duration

    async def caller(seed: int) -> None:
        pick = random.Random(seed).choice
        while time.perf_counter() < stop:
            session_id = pick(sessions)
            t0 = time.perf_counter()
            try:
                await turn(session_id)
            except Exception as exc:  # counted and reported; the load goes on
                name = type(exc).__name__
                load.failed[name] = load.failed.get(name, 0) + 1
                continue
            load.latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(seed) for seed in range(callers)))
    load.seconds = time.perf_counter() - t0
    return load


class ServerStats:
    """Redis's `INFO commandstats` and CPU, read before and after a window."""

    def __init__(self, url: str) -> None:
        self._client = raw_client(url)

    async def read(self) -> dict[str, Any]:
        commands = await self._client.info("commandstats")
        cpu = await self._client.info("cpu")
        return {
            "calls": {
                name.removeprefix("cmdstat_"): int(stats["calls"])
                for name, stats in commands.items()
            },
            "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        }

    async def aclose(self) -> None:
        await self._client.aclose()


def per_turn(before: dict[str, Any], after: dict[str, Any], turns: int) -> dict[str, Any]:
    """Commandstats deltas per turn (total and the `TOP` commands) and server CPU per turn."""
    deltas = {
        name: calls - before["calls"].get(name, 0)
        for name, calls in after["calls"].items()
        if calls > before["calls"].get(name, 0)
    }
    ranked = sorted(deltas.items(), key=lambda item: -item[1])
    turns = max(turns, 1)
    return {
        "calls_total": round(sum(deltas.values()) / turns, 2),
        "calls_top": {name: round(calls / turns, 2) for name, calls in ranked[:TOP]},
        "server_cpu_us": round((after["cpu_s"] - before["cpu_s"]) * 1e6 / turns, 1),
    }


def _summary(load: Load) -> dict[str, Any]:
    return {
        "turns": len(load.latencies),
        "seconds": round(load.seconds, 3),
        "turns_per_s": round(load.rate, 1),
        "latency_ms": summarize(load.latencies),
        "failed": load.failed,
    }


async def run(ctx: BenchContext) -> dict[str, Any]:
    count: int = ctx.pick(2000, 200)
    callers: int = ctx.pick(64, 16)
    duration: float = ctx.pick(60.0, 5.0)
    baseline_s: float = ctx.pick(5.0, 1.0)
    sample_s: float = ctx.pick(3.0, 1.0)
    namespace = ctx.unique("sustained")
    floor = FusedFloor(ctx, namespace + ":floor")
    stats = ServerStats(ctx.redis_url)
    node_id = ctx.unique("sustained-node-")
    try:
        await floor.start(holder=False)
        async with redis_router(
            ctx.redis_url, namespace, node_id, max_cached_sessions=2 * count
        ) as (router, _):
            sessions = [f"sus-{i}" for i in range(count)]
            claims = await claim_all(router, sessions, callers)
            ctx.progress(f"{count} sessions claimed ({claims:.0f}/s)")

            async def turn(session_id: str) -> None:
                await (await router.submit(request(session_id))).result

            async def floor_turn(session_id: str) -> None:
                await floor.local()

            floors = [await _load(floor_turn, sessions, callers, baseline_s)]
            before = await stats.read()
            load = await _load(turn, sessions, callers, duration)
            after = await stats.read()
            ctx.progress(f"{duration:.0f}s of load: {load.rate:.0f} turns/s")
            floors.append(await _load(floor_turn, sessions, callers, baseline_s))
            async with CommandTally(ctx.redis_url) as tally:
                sample = await _load(turn, sessions, callers, sample_s)
            held = len(router.local_sessions())
    finally:
        await stats.aclose()
        await floor.aclose()
    config = {
        "sessions": count,
        "callers": callers,
        "duration_s": duration,
        "baseline_window_s": baseline_s,
        "monitor_sample_s": sample_s,
        "floor_steps": FLOOR_LOCAL_STEPS,
    }
    results = {
        "claims_per_s": round(claims, 1),
        "held_at_end": held,
        "stickless": _summary(load),
        "floor_local": [_summary(window) for window in floors],
        "commandstats_per_turn": per_turn(before, after, len(load.latencies)),
        "monitor_sample_per_turn": tally.per_turn(max(len(sample.latencies), 1)),
    }
    return _report(config, results, floors)


def _report(config: dict[str, Any], results: dict[str, Any], floors: list[Load]) -> dict[str, Any]:
    mine = results["stickless"]
    latency = mine["latency_ms"]
    base = summarize([value for window in floors for value in window.latencies])
    base_rate = sum(window.rate for window in floors) / len(floors)
    stats = results["commandstats_per_turn"]
    sample = results["monitor_sample_per_turn"]
    n, callers = config["sessions"], config["callers"]
    ratios: dict[str, Any] = {"turns_per_s": ratio(mine["turns_per_s"], base_rate)}
    rows: list[list[Any]] = [
        [f"turns/s, {n:,} sessions, {callers} random callers", mine["turns_per_s"], base_rate,
         ratios["turns_per_s"]],
    ]  # fmt: skip
    for q in ("p50", "p95", "p99"):
        ratios[f"latency_{q}"] = ratio(latency.get(q), base.get(q))
        rows.append([f"turn latency {q} (ms)", latency.get(q), base.get(q), ratios[f"latency_{q}"]])
    rows.append(["failed turns", sum(mine["failed"].values()), 0, None])
    rows.append(["Redis calls per turn (commandstats, scripts' inside included)",
                 stats["calls_total"], "-", None])  # fmt: skip
    for name, calls in stats["calls_top"].items():
        rows.append([f"  {name} per turn", calls, "-", None])
    rows.append(["redis-server CPU per turn (us)", stats["server_cpu_us"], "-", None])
    rows.append(["commands sent per turn (MONITOR sample)", sample["sent_total"], 2, None])
    for name, calls in list(sample["scripts"].items())[:TOP]:
        if calls:  # rarer than one in 200 turns rounds to 0: left to the JSON
            rows.append([f"  script {name} per turn", calls, "-", None])
    rows.append(["commands run inside scripts per turn (sample)", sample["in_scripts"], "-", None])
    rows.append(["new-session claims/s (first turn)", results["claims_per_s"], "-", None])
    notes = [
        f"{config['duration_s']:.0f}s of load: {callers} callers, each submitting echo turns to "
        f"sessions drawn at random among {n:,} held by one router over Redis",
        f"baseline: the fused local floor ({' -> '.join(config['floor_steps'])}) by {callers} "
        f"callers, {config['baseline_window_s']:.0f}s before and after the timed window",
        "commandstats counts every command Redis executed in the window (background loops and "
        "commands inside scripts included); the sample splits sent / inside scripts with "
        f"MONITOR over {config['monitor_sample_s']:.0f}s of the same load, after the timing",
    ]
    return {
        "config": config,
        "results": {
            **results,
            "floor_local_pooled": {"latency_ms": base, "turns_per_s": base_rate},
        },
        "ratios": ratios,
        "rows": rows,
        "goals": [],
        "notes": notes,
    }
