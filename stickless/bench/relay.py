"""Scenario `relay`: one-way latency of turn events from the holder to a subscriber on another
node process, paced and burst, against raw redis-py pub/sub between the same two processes.

The holder is a `stickless node` process whose bench agent emits TextDelta frames carrying
`time.time_ns()`; the subscriber is a router in the bench process (`router.events(session)`)
over the same Redis. Latency = receive time - embedded send time (one machine, one clock).
The baseline is a small publisher process (`stickless.bench._rawpub`) PUBLISHing messages of
the same size as stickless's one-frame EVENT message on a raw channel that the bench process
reads with redis-py. Rounds of the two alternate (ABBA) within one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .._events import Event, TextDelta, is_terminal
from ..router import EventStream
from ._common import raw_client, redis_router, request
from ._procs import NodeProc, read_line
from ._runner import BenchContext
from ._stats import flatten, ratio, rounded, summarize, value_spread
from .agent import relay_spec, sent_ns

TITLE = "Cross-node event relay latency (holder process -> subscriber process over Redis)"
BASELINE = (
    "raw redis-py PUBLISH (publisher process) -> pub/sub reader (bench process), same bytes "
    "per message as stickless's one-frame EVENT message"
)

#: Published numbers of the Java original (ms), for context only.
JAVA_REFERENCE = {
    "paced": {"p50": 1.73, "p95": 2.97, "p99": 3.74},
    "burst": {"p50": 0.15, "p95": 0.22, "p99": 0.33, "events_per_s": 6300},
}
#: Characters of each frame's text (the timestamp plus padding).
TEXT_SIZE = 64
PACED_INTERVAL = 0.010


@dataclass
class Round:
    """One round of one contender: per-event latencies (ms) and timing of the stream."""

    latencies: list[float] = field(default_factory=list)
    first_sent: int = 0
    last_sent: int = 0
    last_received: int = 0
    sent: int = 0
    dropped: int = 0

    def record(self, sent: int, received: int) -> None:
        if not self.latencies:
            self.first_sent = sent
        self.latencies.append((received - sent) / 1e6)
        self.last_sent = sent
        self.last_received = received

    @property
    def delivered_rate(self) -> float:
        """Events received per second from the first send to the last receipt."""
        span = (self.last_received - self.first_sent) / 1e9
        return len(self.latencies) / span if span > 0 else 0.0

    @property
    def produced_rate(self) -> float:
        span = (self.last_sent - self.first_sent) / 1e9
        return len(self.latencies) / span if span > 0 else 0.0


class RawPublisher:
    """The baseline's publisher process."""

    def __init__(self, ctx: BenchContext) -> None:
        self._ctx = ctx
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.process = self._ctx.processes.spawn(
            [sys.executable, "-m", "stickless.bench._rawpub", self._ctx.redis_url],
            stdin=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        line = await read_line(self.process.stdout, 30.0, "raw publisher")
        if line != "READY":
            raise RuntimeError(f"raw publisher did not start: {line!r}")

    def command(self, text: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write((text + "\n").encode())
        self.process.stdin.flush()

    async def done(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        line = await read_line(self.process.stdout, 60.0, "raw publisher")
        if line != "DONE":
            raise RuntimeError(f"raw publisher answered {line!r}")

    async def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.command("quit")
            await asyncio.to_thread(self._ctx.processes.stop, self.process)


async def _stickless_round(
    holder: NodeProc, stream: EventStream, session_id: str, spec: str, count: int, bound: float
) -> Round:
    result = Round(sent=count)
    dropped_before = stream.dropped
    async with asyncio.timeout(bound):
        ticket = await holder.client.submit(request(session_id, spec))
        turn_id = str(ticket["turn_id"])
        event: Event
        async for event in stream:
            received = time.time_ns()
            if event.turn_id != turn_id:
                continue
            if isinstance(event, TextDelta):
                result.record(sent_ns(event.text), received)
            elif is_terminal(event):
                break
        await holder.client.result(turn_id)
    result.dropped = count - len(result.latencies)
    if stream.dropped != dropped_before:
        result.dropped = max(result.dropped, stream.dropped - dropped_before)
    return result


async def _raw_round(
    publisher: RawPublisher, pubsub: Any, channel: str, command: str, count: int, bound: float
) -> Round:
    result = Round(sent=count)
    async with asyncio.timeout(bound):
        publisher.command(command)
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            received = time.time_ns()
            if message is None or message.get("type") != "message":
                continue
            data: bytes = message["data"]
            if data == b"END":
                break
            result.record(sent_ns(data.decode()), received)
        await publisher.done()
    result.dropped = count - len(result.latencies)
    return result


async def _message_size(
    ctx: BenchContext, channel: str, holder: NodeProc, stream: EventStream, session_id: str
) -> int:
    """The bytes of one stickless EVENT message carrying one paced frame (measured on the wire)."""
    client = raw_client(ctx.redis_url)
    pubsub = client.pubsub()
    sizes: list[int] = []
    try:
        await pubsub.subscribe(channel)
        spec = relay_spec("paced", 10, PACED_INTERVAL, TEXT_SIZE)
        await _stickless_round(holder, stream, session_id, spec, 10, 30.0)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and len(sizes) < 10:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None and message.get("type") == "message":
                sizes.append(len(message["data"]))
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()
    if not sizes:
        raise RuntimeError("no EVENT message seen on the session's channel")
    return int(statistics.median(sizes))


async def run(ctx: BenchContext) -> dict[str, Any]:
    repeats: int = ctx.pick(5, 2)
    paced_count: int = ctx.pick(200, 40)
    burst_count: int = ctx.pick(3000, 400)
    namespace = ctx.unique("relay")
    session_id = ctx.unique("relay-s")
    holder = await ctx.node(ctx.unique("relay-holder-"), namespace, {})
    publisher = RawPublisher(ctx)
    client = raw_client(ctx.redis_url)
    pubsub = client.pubsub()
    raw_channel = f"{namespace}:raw"
    rounds: dict[str, list[Round]] = {
        "stickless_paced": [],
        "raw_paced": [],
        "stickless_burst": [],
        "raw_burst": [],
    }
    try:
        await publisher.start()
        async with redis_router(ctx.redis_url, namespace, ctx.unique("relay-sub-")) as (
            router,
            backends,
        ):
            stream = router.events(session_id)
            await stream.ready()
            channel = backends.keys.event_channel(session_id)
            size = await _message_size(ctx, channel, holder, stream, session_id)
            await pubsub.subscribe(raw_channel)
            # Warm-up of both paths (connections, scripts, caches); not recorded.
            await _stickless_round(
                holder, stream, session_id, relay_spec("burst", 200, 0, TEXT_SIZE), 200, 30
            )
            await _raw_round(publisher, pubsub, raw_channel, f"burst {raw_channel} 200 0 {size}",
                             200, 30)  # fmt: skip
            for index in range(repeats):
                for mode, count, interval in (
                    ("paced", paced_count, PACED_INTERVAL),
                    ("burst", burst_count, 0.0),
                ):
                    bound = 30.0 + count * interval * 3
                    spec = relay_spec(mode, count, interval, TEXT_SIZE)
                    command = f"{mode} {raw_channel} {count} {interval} {size}"
                    order = ["stickless", "raw"] if index % 2 == 0 else ["raw", "stickless"]
                    for contender in order:
                        if contender == "stickless":
                            got = await _stickless_round(
                                holder, stream, session_id, spec, count, bound
                            )
                        else:
                            got = await _raw_round(
                                publisher, pubsub, raw_channel, command, count, bound
                            )
                        rounds[f"{contender}_{mode}"].append(got)
                ctx.progress(f"repeat {index + 1}/{repeats} done")
            await stream.aclose()
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()
        await publisher.stop()
        await holder.stop()
    return _report(rounds, size, repeats, paced_count, burst_count)


def _report(
    rounds: dict[str, list[Round]], size: int, repeats: int, paced_count: int, burst_count: int
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, items in rounds.items():
        groups = [r.latencies for r in items]
        entry: dict[str, Any] = {
            "latency_ms": summarize(flatten(groups), groups),
            "dropped": sum(r.dropped for r in items),
        }
        if name.endswith("burst"):
            entry["delivered_events_per_s"] = value_spread([r.delivered_rate for r in items])
            entry["produced_events_per_s"] = value_spread([r.produced_rate for r in items])
        results[name] = entry
    ratios: dict[str, Any] = {}
    for mode in ("paced", "burst"):
        mine = results[f"stickless_{mode}"]["latency_ms"]
        raw = results[f"raw_{mode}"]["latency_ms"]
        for q in ("p50", "p95", "p99"):
            ratios[f"{mode}_{q}"] = ratio(mine.get(q), raw.get(q))
    rate = results["stickless_burst"]["delivered_events_per_s"].get("p50")
    raw_rate = results["raw_burst"]["delivered_events_per_s"].get("p50")
    ratios["burst_rate"] = ratio(rate, raw_rate)
    rows: list[list[Any]] = []
    for mode in ("paced", "burst"):
        mine = results[f"stickless_{mode}"]["latency_ms"]
        raw = results[f"raw_{mode}"]["latency_ms"]
        for q in ("p50", "p95", "p99", "max"):
            rows.append(
                [
                    f"{mode} latency {q} (ms)",
                    mine.get(q),
                    raw.get(q),
                    ratio(mine.get(q), raw.get(q)),
                ]
            )
        spread_mine = mine.get("across_repeats", {}).get("p99", [None, None])
        spread_raw = raw.get("across_repeats", {}).get("p99", [None, None])
        rows.append(
            [f"{mode} p99 min..max over repeats", _range(spread_mine), _range(spread_raw), None]
        )
    rows.append(["burst delivered events/s (median)", rate, raw_rate, ratios["burst_rate"]])
    rows.append([
        "burst events dropped (all rounds)",
        results["stickless_burst"]["dropped"],
        results["raw_burst"]["dropped"],
        None,
    ])  # fmt: skip
    paced = results["stickless_paced"]["latency_ms"]
    goals = [
        _goal("relay p50 <= 1.3x raw pub/sub (paced)", "<= 1.3", ratios["paced_p50"]),
        _goal("relay p99 <= 1.3x raw pub/sub (paced)", "<= 1.3", ratios["paced_p99"]),
        {
            "goal": "sustained burst >= 20k events/s per session",
            "target": ">= 20000",
            "measured": rate,
            "met": None if rate is None else rate >= 20000,
        },
    ]
    notes = [
        f"{repeats} repeats x ({paced_count} paced at {PACED_INTERVAL * 1000:.0f} ms + "
        f"{burst_count} burst) events per contender; message size {size} bytes",
        f"Java original (published): paced p50/p95/p99 {JAVA_REFERENCE['paced']['p50']}/"
        f"{JAVA_REFERENCE['paced']['p95']}/{JAVA_REFERENCE['paced']['p99']} ms; burst "
        f"{JAVA_REFERENCE['burst']['p50']}/{JAVA_REFERENCE['burst']['p95']}/"
        f"{JAVA_REFERENCE['burst']['p99']} ms at ~6.3k events/s; "
        f"here paced p50 {paced.get('p50')} ms",
    ]
    return {
        "config": {
            "repeats": repeats,
            "paced_events": paced_count,
            "paced_interval_s": PACED_INTERVAL,
            "burst_events": burst_count,
            "text_chars": TEXT_SIZE,
            "message_bytes": size,
        },
        "results": results,
        "ratios": ratios,
        "reference_java_ms": JAVA_REFERENCE,
        "rows": rows,
        "goals": goals,
        "notes": notes,
    }


def _range(pair: list[float | None]) -> str:
    low, high = pair
    return "-" if low is None or high is None else f"{low:.3f}..{high:.3f}"


def _goal(goal: str, target: str, measured: float | None) -> dict[str, Any]:
    return {
        "goal": goal,
        "target": target,
        "measured": rounded(measured, 3),
        "met": None if measured is None else measured <= 1.3,
    }
