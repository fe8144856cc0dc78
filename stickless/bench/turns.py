"""Scenario `turns`: latency and throughput of one turn (echo agent, no tokens), local and
forwarded, over memory (`LocalCluster`) and over Redis (forwarded crosses processes), against
the minimum Redis round trips the protocol needs, timed raw with redis-py in the same run.

Contenders, interleaved round by round (the order rotates each repeat):

- memory local / forwarded: a 2-node `LocalCluster`, submit on the holder / on the other node;
- redis local: a router in the bench process over Redis that holds the session;
- redis forwarded: submit on that router, the session held by a `stickless node` process;
- raw local min: the round trips a local turn needs before its caller can be answered, each a
  redis-py call with no server-side work (EVALSHA of a trivial script):
  record load (MULTI HMGET+LRANGE), put_if_absent, collect, mark_done;
- raw forwarded min: submitter: record load, put_if_absent, lease acquire (lost),
  release_holder, inbox deliver, PUBLISH doorbell -> pub/sub receipt on the holder's
  connection; holder: collect, acquire_holder, mark_done, PUBLISH TURN_RESULT -> pub/sub
  receipt on the submitter's connection (10 round trips + 2 pub/sub hops);
- floor local / floor forwarded: the fused path's floors (`_floors`): no-op scripts of the
  fused scripts' shape, local = submit + finish (2 round trips), forwarded = submit with the
  doorbell PUBLISH inside -> hop to a holder process (raw redis-py) -> take, finish with the
  TURN_RESULT PUBLISH inside -> hop back (3 round trips + 2 pub/sub hops, across processes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..router import SessionRouter
from ..testing import LocalCluster
from ._common import CommandTally, raw_client, redis_router, request
from ._floors import FLOOR_FORWARDED_STEPS, FLOOR_LOCAL_STEPS, FusedFloor
from ._runner import BenchContext
from ._stats import flatten, ratio, summarize, value_spread
from .agent import make_opener

TITLE = "Turn round trip: local and forwarded, memory and Redis (forwarded across processes)"
BASELINE = (
    "the minimum Redis round trips of the protocol path, each timed raw with redis-py "
    "(trivial EVALSHA / same commands / pub/sub hops) in the same run; and the fused path's "
    "floors: no-op scripts of the fused scripts' shape (local 2 round trips, forwarded 3 + 2 "
    "pub/sub hops across processes)"
)

TurnFn = Callable[[], Awaitable[None]]

#: A trivial script standing in for each protocol step's Lua script (round trip, no work).
_NOOP = "return 1"

RAW_LOCAL_STEPS = ["record load", "put_if_absent", "collect", "mark_done"]
RAW_FORWARDED_STEPS = [
    "record load",
    "put_if_absent",
    "lease acquire (lost)",
    "release_holder",
    "inbox deliver",
    "PUBLISH doorbell + pub/sub hop",
    "collect",
    "acquire_holder",
    "mark_done",
    "PUBLISH TURN_RESULT + pub/sub hop",
]
#: The stickless contenders (also timed for throughput).
STICKLESS = ["memory_local", "memory_forwarded", "redis_local", "redis_forwarded"]
#: Each Redis contender's raw protocol minimum, and its fused-path floor.
PAIRS = {"redis_local": "raw_local_min", "redis_forwarded": "raw_forwarded_min"}
FLOORS = {"redis_local": "floor_local", "redis_forwarded": "floor_forwarded"}
#: The issue's goals: latency <= 1.5x the floor, commands sent per turn (scripts included).
FLOOR_GOAL = 1.5
COMMAND_GOALS = {"redis_local": 3, "redis_forwarded": 6}


def _router_turn(router: SessionRouter, session_id: str) -> TurnFn:
    async def one() -> None:
        disposition = await router.submit(request(session_id))
        await disposition.result

    return one


class RawPath:
    """The protocol's minimum round trips, raw (submitter and holder on their own connections)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.submitter = raw_client(url)
        self.holder = raw_client(url)
        self.prefix = prefix
        self.doorbell = f"{prefix}:doorbell"
        self.result = f"{prefix}:result"
        self._sha = ""
        self._holder_sub: Any = None
        self._submitter_sub: Any = None

    async def start(self) -> None:
        self._sha = str(await self.submitter.script_load(_NOOP))
        self._holder_sub = self.holder.pubsub(ignore_subscribe_messages=True)
        self._submitter_sub = self.submitter.pubsub(ignore_subscribe_messages=True)
        await self._holder_sub.subscribe(self.doorbell)
        await self._submitter_sub.subscribe(self.result)
        for sub in (self._holder_sub, self._submitter_sub):  # consume the confirmations
            await sub.get_message(timeout=1.0)

    async def aclose(self) -> None:
        for sub in (self._holder_sub, self._submitter_sub):
            if sub is not None:
                await sub.aclose()
        await self.submitter.aclose()
        await self.holder.aclose()

    async def _script(self, client: Any, key: str) -> None:
        await client.evalsha(self._sha, 1, f"{{{self.prefix}}}:{key}", "a", "b")

    async def _load(self) -> None:
        pipe = self.submitter.pipeline(transaction=True)
        pipe.hmget(f"{{{self.prefix}}}:record", ["agent", "fence"])
        pipe.lrange(f"{{{self.prefix}}}:transcript", 0, -1)
        await pipe.execute()

    async def _hop(self, client: Any, channel: str, sub: Any) -> None:
        await client.publish(channel, b"x" * 200)
        while True:
            message = await sub.get_message(timeout=5.0)
            if message is not None and message.get("type") == "message":
                return

    async def local(self) -> None:
        await self._load()
        await self._script(self.submitter, "idem")
        await self._script(self.submitter, "inbox")
        await self._script(self.submitter, "idem")

    async def forwarded(self) -> None:
        s, h = self.submitter, self.holder
        await self._load()
        await self._script(s, "idem")
        await self._script(s, "lease")
        await self._script(s, "idem")
        await self._script(s, "inbox")
        await self._hop(s, self.doorbell, self._holder_sub)
        await self._script(h, "inbox")
        await self._script(h, "idem")
        await self._script(h, "idem")
        await self._hop(h, self.result, self._submitter_sub)

    async def rtt(self) -> None:
        await self._script(self.submitter, "idem")


async def _latencies(turn: TurnFn, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        await turn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def _throughput(turn: TurnFn, total: int, concurrency: int) -> float:
    """Turns per second with `concurrency` callers submitting to the same session."""
    remaining = total

    async def caller() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await turn()

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return total / (time.perf_counter() - t0)


async def run(ctx: BenchContext) -> dict[str, Any]:
    repeats: int = ctx.pick(5, 2)
    per_round: int = ctx.pick(150, 25)
    tput_total: int = ctx.pick(200, 60)
    tput_repeats: int = ctx.pick(3, 1)
    concurrency = 8
    namespace = ctx.unique("turns")
    memory = LocalCluster(2, opener=make_opener())
    raw = RawPath(ctx.redis_url, namespace + ":raw")
    floor = FusedFloor(ctx, namespace + ":floor")
    holder = await ctx.node(ctx.unique("turns-holder-"), namespace, {})
    try:
        await memory.start()
        await raw.start()
        await floor.start()
        async with redis_router(ctx.redis_url, namespace, ctx.unique("turns-a-")) as (router, _):
            mem_session, redis_local, redis_fwd = (ctx.unique("t-") for _ in range(3))
            await _router_turn(memory.nodes[0], mem_session)()  # node 0 holds it
            await _router_turn(router, redis_local)()  # the bench router holds it
            await holder.client.run(request(redis_fwd))  # the node process holds it
            contenders: dict[str, TurnFn] = {
                "memory_local": _router_turn(memory.nodes[0], mem_session),
                "memory_forwarded": _router_turn(memory.nodes[1], mem_session),
                "redis_local": _router_turn(router, redis_local),
                "redis_forwarded": _router_turn(router, redis_fwd),
                "raw_local_min": raw.local,
                "raw_forwarded_min": raw.forwarded,
                "raw_round_trip": raw.rtt,
                "floor_local": floor.local,
                "floor_forwarded": floor.forwarded,
            }
            for turn in contenders.values():  # warm-up
                await _latencies(turn, 10)
            samples: dict[str, list[list[float]]] = {name: [] for name in contenders}
            names = list(contenders)
            for index in range(repeats):
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    samples[name].append(await _latencies(contenders[name], per_round))
                ctx.progress(f"latency repeat {index + 1}/{repeats} done")
            rates: dict[str, list[float]] = {name: [] for name in STICKLESS}
            for index in range(tput_repeats):
                shift = index % len(rates)
                for name in list(rates)[shift:] + list(rates)[:shift]:
                    rates[name].append(await _throughput(contenders[name], tput_total, concurrency))
            ctx.progress("throughput done")
            commands: dict[str, dict[str, Any]] = {}
            for name in (*PAIRS, *PAIRS.values(), *FLOORS.values()):
                async with CommandTally(ctx.redis_url) as tally:
                    await _latencies(contenders[name], 50)
                commands[name] = tally.per_turn(50)
    finally:
        await floor.aclose()
        await raw.aclose()
        await memory.aclose()
        await holder.stop()
    return _report(
        samples, rates, commands, repeats, per_round, tput_total, tput_repeats, concurrency
    )


def _report(
    samples: dict[str, list[list[float]]],
    rates: dict[str, list[float]],
    commands: dict[str, dict[str, Any]],
    repeats: int,
    per_round: int,
    tput_total: int,
    tput_repeats: int,
    concurrency: int,
) -> dict[str, Any]:
    latency = {name: summarize(flatten(groups), groups) for name, groups in samples.items()}
    throughput = {name: value_spread(values) for name, values in rates.items()}
    ratios: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for name in ("memory_local", "memory_forwarded"):
        stats = latency[name]
        rows.append(
            [f"{name} p50 / p99 (ms)", f"{stats['p50']:.3f} / {stats['p99']:.3f}", "-", None]
        )
    for name, base in PAIRS.items():
        mine, raw = latency[name], latency[base]
        for q in ("p50", "p99"):
            ratios[f"{name}_{q}"] = ratio(mine[q], raw[q])
        ratios[f"{name}_mean"] = ratio(mine["mean"], raw["mean"])
        for q in ("p50", "p95", "p99"):
            rows.append([f"{name} {q} (ms) vs {base}", mine[q], raw[q], ratio(mine[q], raw[q])])
    for name, base in FLOORS.items():
        mine, floor = latency[name], latency[base]
        for q in ("p50", "p99"):
            ratios[f"{name}_{q}_vs_floor"] = ratio(mine[q], floor[q])
        for q in ("p50", "p95", "p99"):
            rows.append([f"{name} {q} (ms) vs {base}", mine[q], floor[q], ratio(mine[q], floor[q])])
    rtt = latency["raw_round_trip"]
    rows.append(["one raw round trip (EVALSHA no-op) p50 (ms)", "-", rtt["p50"], None])
    for name, spread in throughput.items():
        rows.append(
            [f"{name} turns/s, {concurrency} callers on 1 session", spread.get("p50"), "-", None]
        )
    for name in PAIRS:
        sent = commands.get(name, {}).get("sent_total")
        for base in (PAIRS[name], FLOORS[name]):
            least = commands.get(base, {}).get("sent_total")
            rows.append(
                [f"{name} Redis commands sent per turn vs {base}", sent, least, ratio(sent, least)]
            )
        inside = commands.get(name, {}).get("in_scripts")
        rows.append([f"{name} commands run inside scripts per turn", inside, "-", None])
    return {
        "config": {
            "repeats": repeats,
            "turns_per_round": per_round,
            "throughput_turns": tput_total,
            "throughput_callers": concurrency,
            "throughput_repeats": tput_repeats,
            "raw_local_steps": RAW_LOCAL_STEPS,
            "raw_forwarded_steps": RAW_FORWARDED_STEPS,
            "floor_local_steps": FLOOR_LOCAL_STEPS,
            "floor_forwarded_steps": FLOOR_FORWARDED_STEPS,
        },
        "results": {
            "latency_ms": latency,
            "throughput_turns_per_s": throughput,
            "redis_commands_per_turn": commands,
        },
        "ratios": ratios,
        "rows": rows,
        "goals": _goals(ratios, commands),
        "notes": _notes(latency, repeats, per_round, tput_total, tput_repeats, concurrency),
    }


def _goals(ratios: dict[str, Any], commands: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    fwd = ratios.get("redis_forwarded_p50")
    goals = [
        {
            "goal": "forwarded turn <= 1.5x its raw Redis round trips (p50)",
            "target": "<= 1.5",
            "measured": fwd,
            "met": None if fwd is None else fwd <= 1.5,
        }
    ]
    for name, floor in FLOORS.items():
        measured = ratios.get(f"{name}_p50_vs_floor")
        goals.append(
            {
                "goal": f"{name} p50 <= {FLOOR_GOAL}x its fused floor ({floor})",
                "target": f"<= {FLOOR_GOAL}",
                "measured": measured,
                "met": None if measured is None else measured <= FLOOR_GOAL,
            }
        )
    for name, most in COMMAND_GOALS.items():
        sent = commands.get(name, {}).get("sent_total")
        goals.append(
            {
                "goal": f"{name} Redis commands sent per turn (scripts included)",
                "target": f"<= {most}",
                "measured": sent,
                "met": None if sent is None else sent <= most,
            }
        )
    return goals


def _notes(
    latency: dict[str, dict[str, Any]],
    repeats: int,
    per_round: int,
    tput_total: int,
    tput_repeats: int,
    concurrency: int,
) -> list[str]:
    rtt_p50 = latency["raw_round_trip"].get("p50") or 0
    return [
        f"{repeats} repeats x {per_round} sequential turns per contender; throughput: "
        f"{tput_total} turns by {concurrency} concurrent callers, {tput_repeats} repeats",
        f"raw forwarded min = {len(RAW_FORWARDED_STEPS)} steps: {', '.join(RAW_FORWARDED_STEPS)}",
        f"raw local min = {', '.join(RAW_LOCAL_STEPS)}",
        f"floor local = {' -> '.join(FLOOR_LOCAL_STEPS)} (no-op scripts of the fused shape)",
        f"floor forwarded = {' -> '.join(FLOOR_FORWARDED_STEPS)} (holder: a raw redis-py process)",
        "stickless forwarded p50 = "
        + (
            f"{latency['redis_forwarded']['p50'] / rtt_p50:.1f} raw round trips" if rtt_p50 else "-"
        ),
    ]
