"""Scenario `renewal`: what one renewal tick of a node holding N sessions costs over Redis,
through the runtime's own renewer (`router.renewer.tick()`), at 1k / 10k / 100k sessions
(quick: 1k and 5k).

It runs in a fresh worker process (``python -m stickless.bench.renewal``) so that N sessions
of state neither blur the bench process nor need tearing down (the worker exits without
closing; its namespace dies with the run's Redis). There, one DISTRIBUTED router over the run's
Redis (renewal interval longer than the worker lives, so its own thread never ticks and the
timed ticks run on the worker's loop):

- `BUSY` sessions get a long turn through `router.submit` (the router claims them and owns
  their reservations itself, whatever "owning" means in the runtime at hand);
- the other sessions are held idle the way a claim takes a lease (`_hold`: the lease store's
  acquire, then `renewer.track`), which costs one round trip each instead of a whole first
  turn (claiming 100k sessions through turns would take minutes);
- at each size, `router.renewer.tick()` is timed `repeats` times, interleaved with a raw
  redis-py no-op EVALSHA round trip (the least one renewal call can cost: the baseline).

Warnings the runtime logs during the ticks (a failed renewal) are counted and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from ._stats import ratio, summarize

if TYPE_CHECKING:
    from ..router import SessionRouter
    from ._runner import BenchContext

TITLE = "Lease renewal tick over Redis: one node holding 1k / 10k / 100k sessions"
BASELINE = "one raw redis-py no-op EVALSHA round trip (the least a renewal call can cost)"
#: Sessions running a long turn (their reservations owned by the router) at every size.
BUSY = 64
#: Lease TTL and renewal interval of the worker's router: longer than the worker lives.
LEASE_TTL = 3600.0
INTERVAL = 1800.0
#: Leases acquired concurrently while holding the idle sessions.
HOLD_BATCH = 512
#: Raw round trips timed per tick (their median is the baseline sample).
RTT_SAMPLES = 20
#: The renewal goal: a tick independent of N, within 2 ms at 100k sessions.
GOAL_MS = 2.0
GOAL_SESSIONS = 100_000
WORKER_TIMEOUT = 600.0


# ====================================================================== worker (subprocess)


async def _hold(router: SessionRouter, session_ids: list[str]) -> int:
    """Hold idle sessions the way `LocalSessions.claim` takes a lease (the lease store's
    acquire, then `renewer.track`; the one step here to follow a change of the claim); how
    many were won."""
    from ..backends.base import Lease

    async def one(session_id: str) -> Lease | None:
        epoch = router.renewer.epoch
        won = await router.backends.leases.acquire(session_id, router.node_id)
        if not isinstance(won, Lease) or not router.renewer.track(won, epoch):
            return None
        return won

    held = 0
    for start in range(0, len(session_ids), HOLD_BATCH):
        batch = session_ids[start : start + HOLD_BATCH]
        held += sum(lease is not None for lease in await asyncio.gather(*map(one, batch)))
    return held


async def _worker(url: str, namespace: str, sizes: list[int], repeats: int) -> dict[str, Any]:
    """Hold each size's sessions, time the ticks; the router is left open (the process exits)."""
    from .._config import DeploymentMode, RouterConfig
    from ..backends.redis import RedisBackends
    from ..router import SessionRouter
    from ._common import LogCounter, raw_client, request
    from .agent import make_opener

    raw = raw_client(url)
    sha = str(await raw.script_load("return 1"))
    config = RouterConfig(
        node_id="renewal-node",
        mode=DeploymentMode.DISTRIBUTED,
        lease_ttl=LEASE_TTL,
        lease_extend_interval=INTERVAL,
        idempotency_secondary_ttl=2 * INTERVAL,
    )
    backends = RedisBackends.from_url(url, namespace=namespace)
    router = SessionRouter.build(config=config, opener=make_opener(), backends=backends)
    await router.start()
    for i in range(BUSY):
        await router.submit(request(f"busy-{i}", f"sleep:{LEASE_TTL}"))
    held = BUSY
    named = 0  # idle sessions named so far
    checkpoints = []
    for size in sizes:
        t0 = time.perf_counter()
        new = [f"idle-{i}" for i in range(named, size - BUSY)]
        named += len(new)
        held += await _hold(router, new)
        holds_per_s = len(new) / (time.perf_counter() - t0) if new else None
        ticks: list[float] = []
        rtts: list[float] = []
        with LogCounter() as logged:
            for _ in range(repeats):
                t1 = time.perf_counter()
                await router.renewer.tick()
                ticks.append((time.perf_counter() - t1) * 1000)
                rtts.append(await _rtt(raw, sha))
        checkpoints.append(
            {
                "sessions": size,
                "held": held,
                "busy": BUSY,
                "holds_per_s": None if holds_per_s is None else round(holds_per_s, 1),
                "tick_ms": summarize(ticks),
                "raw_round_trip_ms": summarize(rtts),
                "warnings": logged.counts,
            }
        )
    return {"checkpoints": checkpoints, "default_interval_s": RouterConfig().lease_extend_interval}


async def _rtt(raw: Any, sha: str) -> float:
    """Median of `RTT_SAMPLES` raw no-op EVALSHA round trips (ms)."""
    samples = []
    for _ in range(RTT_SAMPLES):
        t0 = time.perf_counter()
        await raw.evalsha(sha, 0)
        samples.append((time.perf_counter() - t0) * 1000)
    return float(summarize(samples)["p50"])


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stickless.bench.renewal")
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    result = asyncio.run(_worker(args.url, args.namespace, sizes, args.repeats))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    # Skip tearing 100k sessions down one by one: the process is done (its namespace dies with
    # the run's Redis).
    os._exit(0)


# ====================================================================== scenario (bench process)


async def run(ctx: BenchContext) -> dict[str, Any]:
    from ._procs import read_line

    sizes: list[int] = ctx.pick([1000, 10_000, 100_000], [1000, 5000])
    repeats = 3
    args = [sys.executable, "-m", "stickless.bench.renewal", ctx.redis_url, ctx.unique("renewal")]
    args += ["--sizes", ",".join(map(str, sizes)), "--repeats", str(repeats)]
    process = ctx.processes.spawn(args)
    assert process.stdout is not None
    try:
        line = await read_line(process.stdout, WORKER_TIMEOUT, "renewal worker")
    finally:
        await asyncio.to_thread(ctx.processes.stop, process)
    return _report(sizes, repeats, json.loads(line))


def _report(sizes: list[int], repeats: int, worker: dict[str, Any]) -> dict[str, Any]:
    interval = float(worker["default_interval_s"])
    rows: list[list[Any]] = []
    ratios: dict[str, Any] = {}
    ticks: dict[int, float] = {}
    warnings: dict[str, int] = {}
    for point in worker["checkpoints"]:
        n = point["sessions"]
        tick, rtt = point["tick_ms"]["p50"], point["raw_round_trip_ms"]["p50"]
        ticks[n] = tick
        ratios[f"tick_{n}_vs_round_trip"] = ratio(tick, rtt)
        rows.append([f"renewer.tick(), {n:,} sessions held, p50 (ms)", tick, rtt, ratio(tick, rtt)])
        rows.append(
            [
                f"  share of the default {interval:g} s renewal interval ({n:,})",
                ratio(tick, interval * 1000),
                "-",
                None,
            ]
        )
        rows.append(
            [f"  sessions held / busy ({n:,})", f"{point['held']} / {point['busy']}", "-", None]
        )
        if point["holds_per_s"] is not None:
            rows.append(
                [f"  set-up: idle sessions held per s ({n:,})", point["holds_per_s"], "-", None]
            )
        for message, count in point["warnings"].items():
            warnings[message] = warnings.get(message, 0) + count
    smallest, largest = min(ticks), max(ticks)
    ratios[f"tick_{largest}_vs_{smallest}"] = ratio(ticks[largest], ticks[smallest])
    rows.append(
        [
            f"tick growth: {largest:,} vs {smallest:,} sessions",
            ticks[largest],
            ticks[smallest],
            ratios[f"tick_{largest}_vs_{smallest}"],
        ]
    )
    at_goal = ticks.get(GOAL_SESSIONS)
    goals = [
        {
            "goal": f"renewal tick <= {GOAL_MS:g} ms at {GOAL_SESSIONS:,} sessions (O(1))",
            "target": f"<= {GOAL_MS:g} ms",
            "measured": at_goal,
            "met": None if at_goal is None else at_goal <= GOAL_MS,
        }
    ]
    notes = [
        f"median of {repeats} ticks per size, each followed by {RTT_SAMPLES} raw no-op EVALSHA "
        "round trips (their median is the baseline sample); ticks run on the worker's loop, the "
        "renewer's own thread never ticks (interval longer than the worker lives)",
        f"{BUSY} sessions run a long turn (claimed by the router, reservations owned by it); the "
        "others are held idle as a claim takes a lease (lease store acquire + renewer.track)",
        f"share of the interval = tick / the default lease_extend_interval ({interval:g} s)",
    ]
    if at_goal is None:
        notes.append(f"quick mode: {GOAL_SESSIONS:,} sessions not measured (goal not evaluated)")
    for message, count in warnings.items():
        notes.append(f"logged during the ticks: {count} x {message!r}")
    return {
        "config": {"sizes": sizes, "repeats": repeats, "busy": BUSY, "rtt_samples": RTT_SAMPLES},
        "results": worker,
        "ratios": ratios,
        "rows": rows,
        "goals": goals,
        "notes": notes,
    }


if __name__ == "__main__":
    sys.exit(worker_main())
