"""Scenario `http`: the HTTP/SSE gateway (`stickless serve`) through a load balancer, against the
Python API over the same Redis, in the same run.

Three `stickless serve` processes (the bench agent, `stickless.bench.agent:make_opener`) over
the run's Redis behind haproxy (round robin, no stickiness, loopback); a router in the bench
process over the same Redis namespace is the Python API contender. Six sessions are claimed
first, two by each serve process (a turn sent to that process directly), so every session is
held by a serve process: a Python API turn is always forwarded across processes, an HTTP turn
enters at the holder for about a third of the requests (haproxy's `X-Served-By` says which; the
numbers are also split by it).

- (a) turn latency: POST /v1/sessions/{sid}/turns with `Accept: text/event-stream`, read until
  the `turn_completed` frame (echo agent: replies at once), against `router.stream(request)`
  read until its terminal frame;
- (b) event latency: a turn emitting paced TextDelta frames stamped with `time.time_ns()` by the
  agent; receive time (SSE frame parsed by the client / event from `router.events(session)`)
  minus the stamp (one machine, one clock);
- (c) events/s over one stream: a turn emitting small TextDelta frames back to back (the agent
  yields to its loop between them); delivered events / (last receipt - first stamp).

Rounds of the two contenders alternate (ABBA); each (b)/(c) round runs three HTTP turns in a
row, so round robin sends one of them to every serve process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._events import TextDelta, is_terminal
from ..router import SessionRouter
from ._common import redis_router, request
from ._http import SERVED_BY, Balancer, HttpClient, ServeProc
from ._runner import BenchContext
from ._stats import flatten, ratio, summarize, value_spread
from .agent import AGENT_REF, relay_spec, sent_ns

TITLE = "HTTP/SSE gateway through haproxy (3 serve processes) vs the Python API"
BASELINE = (
    "the same turns through the Python API of a router in the bench process over the same "
    "Redis: router.stream (turn latency), router.events (event latency, events/s); the "
    "sessions are held by the serve processes, so every Python API turn is forwarded"
)

NODES = 3
SESSIONS_PER_NODE = 2
#: Characters of each frame's text (the timestamp plus padding), as in `relay`.
TEXT_SIZE = 64
PACED_INTERVAL = 0.005
#: SSE event names that end a turn's stream.
TERMINAL_NAMES = {"turn_completed", "turn_failed", "interrupted", "rejected"}
HTTP, PYTHON = "http", "python"


@dataclass
class Turn:
    """One measured turn: its latency, where it entered, the frames it delivered."""

    latency_ms: float
    at_holder: bool | None = None
    frames: list[float] = field(default_factory=list)  # per-frame latency (ms)
    first_sent: int = 0
    last_received: int = 0

    def record(self, sent: int, received: int) -> None:
        if not self.frames:
            self.first_sent = sent
        self.frames.append((received - sent) / 1e6)
        self.last_received = received

    @property
    def rate(self) -> float:
        span = (self.last_received - self.first_sent) / 1e9
        return len(self.frames) / span if span > 0 else 0.0


class Contenders:
    """The two ways of running one turn: through the balancer, and through the Python API."""

    def __init__(
        self, lb: HttpClient, router: SessionRouter, holders: dict[str, str], bound: float
    ) -> None:
        self.lb = lb
        self.router = router
        self.holders = holders
        self.bound = bound

    async def http(self, session_id: str, spec: str) -> Turn:
        """POST with `Accept: text/event-stream` through the balancer, read to the end."""
        body = {"agent_ref": AGENT_REF, "input": spec}
        path = f"/v1/sessions/{session_id}/turns"
        async with asyncio.timeout(self.bound):
            t0 = time.perf_counter()
            stream = await self.lb.stream("POST", path, body)
            if stream.status != 200:
                await stream.drain()
                raise RuntimeError(f"POST {path}: HTTP {stream.status}")
            turn = Turn(0.0)
            async with contextlib.aclosing(stream.events()) as events:
                async for event in events:
                    if event.name == "text_delta":
                        turn.record(sent_ns(json.loads(event.data)["text"]), event.received_ns)
                    elif event.name in TERMINAL_NAMES:
                        turn.latency_ms = (time.perf_counter() - t0) * 1000
                        if event.name != "turn_completed":
                            raise RuntimeError(f"POST {path}: {event.name} {event.data}")
                        break
                else:
                    raise RuntimeError(f"POST {path}: the stream ended with no terminal frame")
            await stream.drain()
        turn.at_holder = stream.headers.get(SERVED_BY) == self.holders[session_id]
        return turn

    async def python_turn(self, session_id: str, spec: str) -> Turn:
        """`router.stream(request)`, read to the terminal frame (the turn's latency)."""
        async with asyncio.timeout(self.bound):
            t0 = time.perf_counter()
            stream = await self.router.stream(request(session_id, spec))
            turn = Turn(0.0, at_holder=False)
            async with stream:
                # Read to its end, just past the terminal frame: a stream left suspended at its
                # terminal frame and closed leaves its pending read unretrieved.
                async for event in stream:
                    if isinstance(event, TextDelta):
                        turn.record(sent_ns(event.text), time.time_ns())
                    elif is_terminal(event):
                        turn.latency_ms = (time.perf_counter() - t0) * 1000
            await stream.disposition.result
        return turn

    async def python_events(self, session_id: str, spec: str) -> Turn:
        """Subscribe with `router.events(session)` (opened for this turn, so it holds no frames
        of other turns), submit through the Python API, read the turn's frames."""
        async with asyncio.timeout(self.bound), self.router.events(session_id) as stream:
            await stream.ready()
            t0 = time.perf_counter()
            disposition = await self.router.submit(request(session_id, spec))
            turn = Turn(0.0, at_holder=False)
            async for event in stream:
                received = time.time_ns()
                if event.turn_id != disposition.turn_id:
                    continue
                if isinstance(event, TextDelta):
                    turn.record(sent_ns(event.text), received)
                elif is_terminal(event):
                    turn.latency_ms = (time.perf_counter() - t0) * 1000
                    break
            await disposition.result
        return turn


async def _claim(node: ServeProc, session_id: str) -> None:
    """The session's first turn, sent to `node` directly: that node holds it from then on."""
    async with HttpClient(node.port) as client:
        body = {"agent_ref": AGENT_REF, "input": "echo"}
        answer = await client.request("POST", f"/v1/sessions/{session_id}/turns", body)
        if answer.status != 202:
            raise RuntimeError(f"claim of {session_id} on {node.name}: HTTP {answer.status}")
        turn_id = answer.json()["turn_id"]
        done = await client.request("GET", f"/v1/sessions/{session_id}/turns/{turn_id}?wait=10")
        if done.status != 200 or done.json().get("state") != "completed":
            raise RuntimeError(f"claim of {session_id} on {node.name}: {done.body[:200]!r}")


TurnFn = Callable[[str, str], Awaitable[Turn]]


async def _rounds(
    ctx: BenchContext,
    what: str,
    fns: Mapping[str, TurnFn],
    spec: str,
    repeats: int,
    turns: int,
    pick: Callable[[int], str],
) -> dict[str, list[list[Turn]]]:
    """`repeats` rounds of `turns` turns per contender, the contenders' order alternating."""
    out: dict[str, list[list[Turn]]] = {name: [] for name in fns}
    for index in range(repeats):
        order = list(fns) if index % 2 == 0 else list(fns)[::-1]
        for name in order:
            out[name].append([await fns[name](pick(i), spec) for i in range(turns)])
        ctx.progress(f"{what} repeat {index + 1}/{repeats} done")
    return out


async def run(ctx: BenchContext) -> dict[str, Any]:
    repeats: int = ctx.pick(5, 2)
    per_round: int = ctx.pick(100, 20)
    paced_count: int = ctx.pick(100, 20)
    burst_count: int = ctx.pick(2000, 300)
    namespace = ctx.unique("http")
    nodes = [
        ServeProc(ctx.processes, ctx.unique("http-node-"), ctx.redis_url, namespace, {},
                  ctx.workdir)
        for _ in range(NODES)
    ]  # fmt: skip
    balancer = Balancer(ctx.processes, nodes, ctx.workdir)
    rng = random.Random(7)
    try:
        await asyncio.gather(*(node.start() for node in nodes))
        await balancer.start()
        ctx.progress(f"{NODES} serve processes behind haproxy on port {balancer.port}")
        holders: dict[str, str] = {}
        for node in nodes:
            for _ in range(SESSIONS_PER_NODE):
                session_id = ctx.unique("http-s")
                await _claim(node, session_id)
                holders[session_id] = node.name
        sessions = list(holders)
        async with (
            redis_router(ctx.redis_url, namespace, ctx.unique("http-py-")) as (router, _),
            HttpClient(balancer.port) as lb,
        ):
            c = Contenders(lb, router, holders, bound=30.0)
            for session_id in sessions:  # warm-up of both paths, not recorded
                for _ in range(5):
                    await c.http(session_id, "echo")
                    await c.python_turn(session_id, "echo")
                await c.python_events(session_id, "echo")
            turns = await _rounds(
                ctx, "turn latency", {HTTP: c.http, PYTHON: c.python_turn},
                "echo", repeats, per_round, lambda i: rng.choice(sessions),
            )  # fmt: skip
            relay = {HTTP: c.http, PYTHON: c.python_events}
            one = sessions[0]
            paced = await _rounds(
                ctx, "paced events", relay,
                relay_spec("paced", paced_count, PACED_INTERVAL, TEXT_SIZE),
                repeats, NODES, lambda i: one,
            )  # fmt: skip
            burst = await _rounds(
                ctx, "burst events", relay,
                relay_spec("burst", burst_count, 0, TEXT_SIZE),
                repeats, NODES, lambda i: one,
            )  # fmt: skip
    finally:
        await balancer.stop()
        await asyncio.gather(*(node.stop() for node in nodes))
    config = {
        "serve_processes": NODES,
        "sessions": len(holders),
        "repeats": repeats,
        "turns_per_round": per_round,
        "paced_events": paced_count,
        "paced_interval_s": PACED_INTERVAL,
        "burst_events": burst_count,
        "event_turns_per_round": NODES,
        "text_chars": TEXT_SIZE,
    }
    return _report(config, turns, paced, burst)


# ====================================================================== report


def _split(rounds: list[list[Turn]], at_holder: bool | None) -> list[list[Turn]]:
    if at_holder is None:
        return rounds
    return [[t for t in group if t.at_holder is at_holder] for group in rounds]


def _latency(rounds: list[list[Turn]]) -> dict[str, Any]:
    groups = [[t.latency_ms for t in group] for group in rounds]
    return summarize(flatten(groups), groups)


def _frames(rounds: list[list[Turn]]) -> dict[str, Any]:
    groups = [[f for t in group for f in t.frames] for group in rounds]
    return summarize(flatten(groups), groups)


def _rates(rounds: list[list[Turn]]) -> dict[str, Any]:
    return value_spread([t.rate for group in rounds for t in group])


def _report(
    config: dict[str, Any],
    turns: dict[str, list[list[Turn]]],
    paced: dict[str, list[list[Turn]]],
    burst: dict[str, list[list[Turn]]],
) -> dict[str, Any]:
    parts = {"all": None, "entered_at_holder": True, "forwarded": False}
    results: dict[str, Any] = {
        "turn_latency_ms": {
            HTTP: {part: _latency(_split(turns[HTTP], v)) for part, v in parts.items()},
            PYTHON: _latency(turns[PYTHON]),
        },
        "event_latency_ms": {
            HTTP: {part: _frames(_split(paced[HTTP], v)) for part, v in parts.items()},
            PYTHON: _frames(paced[PYTHON]),
        },
        "burst_events_per_s": {
            HTTP: {part: _rates(_split(burst[HTTP], v)) for part, v in parts.items()},
            PYTHON: _rates(burst[PYTHON]),
        },
        "burst_events_dropped": {
            name: sum(config["burst_events"] - len(t.frames) for g in rounds for t in g)
            for name, rounds in burst.items()
        },
    }
    results["paced_events_dropped"] = {
        name: sum(config["paced_events"] - len(t.frames) for g in rounds for t in g)
        for name, rounds in paced.items()
    }
    ratios: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for key, label in (("turn_latency_ms", "turn"), ("event_latency_ms", "event")):
        mine, base = results[key][HTTP], results[key][PYTHON]
        for part in ("all", "forwarded"):
            for q in ("p50", "p99"):
                name = f"{label}_{q}" if part == "all" else f"{label}_forwarded_{q}"
                ratios[name] = ratio(mine[part].get(q), base.get(q))
        for part, what in (("all", "all"), ("entered_at_holder", "at holder"),
                           ("forwarded", "forwarded")):  # fmt: skip
            for q in ("p50", "p99"):
                value = mine[part].get(q)
                rows.append([f"{label} latency {q} (ms), HTTP {what} (n={mine[part]['n']})",
                             value, base.get(q), ratio(value, base.get(q))])  # fmt: skip
    rate, base_rate = results["burst_events_per_s"][HTTP], results["burst_events_per_s"][PYTHON]
    ratios["events_per_s"] = ratio(rate["all"].get("p50"), base_rate.get("p50"))
    ratios["events_per_s_forwarded"] = ratio(rate["forwarded"].get("p50"), base_rate.get("p50"))
    for part, what in (("all", "all"), ("entered_at_holder", "at holder"),
                       ("forwarded", "forwarded")):  # fmt: skip
        value = rate[part].get("p50")
        rows.append([f"events/s over one stream (median), HTTP {what}", value,
                     base_rate.get("p50"), ratio(value, base_rate.get("p50"))])  # fmt: skip
    dropped = results["burst_events_dropped"]
    rows.append(["burst events dropped (all turns)", dropped[HTTP], dropped[PYTHON], None])
    notes = [
        f"{config['repeats']} repeats x ({config['turns_per_round']} echo turns over "
        f"{config['sessions']} sessions + {config['event_turns_per_round']} turns of "
        f"{config['paced_events']} paced ({PACED_INTERVAL * 1000:.0f} ms) and of "
        f"{config['burst_events']} burst frames) per contender, ABBA order",
        "HTTP at holder = haproxy sent the request to the serve process holding the session "
        "(no forward); HTTP forwarded is the like-for-like comparison with the Python API, "
        "whose turns are all forwarded to a serve process",
        "the HTTP client is a minimal asyncio HTTP/1.1 client (stickless/bench/_http.py, one "
        "keep-alive connection to haproxy): the numbers are the gateway's and the balancer's, "
        "not a client library's",
    ]
    if dropped[HTTP] or dropped[PYTHON]:
        sent = config["burst_events"] * config["event_turns_per_round"] * config["repeats"]
        notes.append(
            f"burst frames dropped: HTTP {dropped[HTTP]}, Python {dropped[PYTHON]} of {sent} "
            "each: a subscriber reading slower than the agent emits loses its oldest frames past "
            "subscriber_queue_size (default 1024) frames queued; an SSE stream reads as fast as "
            "it writes to its socket, so a burst longer than the queue overflows it (events/s "
            "counts the frames delivered)"
        )
    return {
        "config": config,
        "results": results,
        "ratios": ratios,
        "rows": rows,
        "goals": [],
        "notes": notes,
    }
