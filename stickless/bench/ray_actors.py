"""Scenario `ray`: what users would pick instead on Ray, on one local Ray cluster.

A 2-node Ray cluster on 127.0.0.1 (`ray.cluster_utils.Cluster`, head + 1 worker, 1 CPU each,
started by `stickless.local_services.local_ray_cluster`) serves both contenders, interleaved
round by round (the order rotates each round):

- the naive alternative: one named async Ray actor per session
  (``.options(name="sess-<id>", namespace=..., get_if_exists=True, lifetime="detached")``)
  whose ``turn`` method returns the echoed text. Creation = create + first call answered;
  latency = warm calls from the driver; memory = USS of each actor's worker process
  (``/proc/<pid>/smaps_rollup``: Private_Clean + Private_Dirty + Private_Hugetlb);
- stickless: `stickless.ray.deploy` of the bench agent (one `NodeRouter` per Ray node, over the
  run's Redis); creation = first turn of a new session through the driver's node router
  (``handle.run.remote(request)``), latency = warm turns held by that router (local) and held by
  the other node's router (forwarded); memory = RSS delta of the local router's process
  (``/proc/<pid>/statm``) over N idle sessions, plus Redis ``used_memory`` per session.

Sessions per node are an EXTRAPOLATION: MemAvailable (read once, with the cluster up, before any
session exists) divided by the measured per-session memory; nothing is run until memory runs out.
Per-session actors take ~1 s each to create, so their number is capped (20 full, 5 quick).

Finally the `ray.kill` failover variant of `failover`: a caller (the head's router) waits on a
long turn forwarded to the holder (the worker's router); the holder router is `ray.kill`ed, the
next turn is submitted at once; measured: kill -> the caller's HOLDER_LOST, kill -> the next turn
served, with fast failover on (peers learn of the death from Ray) and, full mode, off (TTLs and
the sweep only), with `failover`'s short timings (3 s lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from .._errors import TurnFailedError
from ..local_services import RAY_ENV, local_ray_cluster
from ._common import raw_client, request
from ._procs import BENCH_OPENER
from ._runner import BenchContext
from ._stats import flatten, ratio, rounded, summarize, value_spread
from .failover import SHORT, _bounds

TITLE = "Ray: one named actor per session vs stickless routers on the same local Ray cluster"
BASELINE = (
    "the naive alternative on Ray: one named async actor per session (get_if_exists, "
    "detached) running the same echo turn, on the same 2-node loopback cluster, same run"
)

#: Concurrent callers while the idle sessions for the memory measurement are created.
_CREATORS = 16


class SessionActor:
    """The naive alternative: a session is a named Ray actor; a turn is a method call."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.turns = 0

    async def turn(self, text: str) -> str:
        self.turns += 1
        return text

    async def pid(self) -> int:
        return os.getpid()


# ====================================================================== /proc


def uss_bytes(pid: int) -> int:
    """Unique set size of a process: its private pages (/proc/<pid>/smaps_rollup)."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            if line.startswith(("Private_Clean:", "Private_Dirty:", "Private_Hugetlb:")):
                total += int(line.split()[1]) * 1024
    return total


def rss_bytes_of(pid: int) -> int:
    """Resident set size of a process, from /proc/<pid>/statm."""
    with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mem_available() -> int:
    """MemAvailable of the machine in bytes."""
    with open("/proc/meminfo", encoding="ascii") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


async def _redis_used(url: str) -> int:
    client = raw_client(url)
    try:
        info = await client.info("memory")
        return int(info["used_memory"])
    finally:
        await client.aclose()


# ====================================================================== timing


async def _timed(call: Any) -> float:
    t0 = time.perf_counter()
    await call()
    return (time.perf_counter() - t0) * 1000


async def _latencies(calls: list[Any], count: int) -> list[float]:
    """`count` sequential calls, cycling over `calls`; milliseconds each."""
    return [await _timed(calls[i % len(calls)]) for i in range(count)]


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# ====================================================================== run


async def run(ctx: BenchContext) -> dict[str, Any]:
    os.environ.update(RAY_ENV)
    config: dict[str, Any] = {
        "ray_nodes": 2,
        "rounds": ctx.pick(4, 2),
        "actors": ctx.pick(20, 5),
        "timed_sessions": ctx.pick(100, 20),
        "idle_sessions": ctx.pick(1000, 100),
        "calls_per_round": ctx.pick(100, 30),
        "failover_fast_modes": ctx.pick([True, False], [True]),
    }
    t0 = time.monotonic()
    with local_ray_cluster(config["ray_nodes"]) as local:
        ray_nodes = local.node_ids
        config["cluster_start_s"] = round(time.monotonic() - t0, 2)
        ctx.progress(f"Ray cluster of {len(ray_nodes)} nodes up in {config['cluster_start_s']}s")
        results = await _compare(ctx, config, ray_nodes[0], ray_nodes[1])
        failover: dict[str, Any] = {}
        for fast in config["failover_fast_modes"]:
            label = "fast_failover_on" if fast else "fast_failover_off"
            failover[label] = await _failover(ctx, ray_nodes[0], ray_nodes[1], fast)
            ctx.progress(f"ray.kill failover ({label}) done")
        results["failover"] = failover
    return _report(config, results)


async def _compare(ctx: BenchContext, config: dict[str, Any], head: str, worker: str) -> Any:
    import ray

    from ..ray import deploy, undeploy

    namespace = ctx.unique("bench-ray-")
    t0 = time.monotonic()
    handles = deploy(ctx.redis_url, BENCH_OPENER, namespace)
    deploy_s = time.monotonic() - t0
    local, remote = handles[head], handles[worker]  # the driver runs on the head node
    actor_class = ray.remote(SessionActor)
    actors: list[Any] = []
    try:
        router_pid = int(await local.pid.remote())
        available = mem_available()
        # Warm-up of the stickless path (imports, connections); the per-session actors get
        # none: each is a new process, which is what the naive alternative costs per session.
        fwd_session = ctx.unique("ray-fwd-")
        await remote.run.remote(request(fwd_session))
        warm = [ctx.unique("ray-warm-") for _ in range(3)]
        for session in warm:
            await local.run.remote(request(session))
        for _ in range(10):
            await local.run.remote(request(fwd_session))
            await local.ping.remote()
        ctx.progress(f"deployed in {deploy_s:.1f}s, router pid {router_pid}")

        local_sessions: list[str] = []
        create: dict[str, list[list[float]]] = {"ray_actor": [], "stickless": []}
        samples: dict[str, list[list[float]]] = {
            "ray_actor": [],
            "stickless_local": [],
            "stickless_forwarded": [],
            "ray_call_router_ping": [],
        }

        async def new_actor() -> None:
            session = ctx.unique("s")
            actor = actor_class.options(
                name=f"sess-{session}",
                namespace=namespace,
                get_if_exists=True,
                lifetime="detached",
            ).remote(session)
            await actor.turn.remote("echo")
            actors.append(actor)

        async def new_session() -> None:
            session = ctx.unique("ray-s-")
            await local.run.remote(request(session))
            local_sessions.append(session)

        def actor_call(index: int) -> Any:
            return lambda: actors[index].turn.remote("echo")

        def stickless_call(session: str) -> Any:
            return lambda: local.run.remote(request(session))

        rounds: int = config["rounds"]
        actor_split = _split(config["actors"], rounds)
        session_split = _split(config["timed_sessions"], rounds)
        per_round: int = config["calls_per_round"]
        for index in range(rounds):
            steps: list[tuple[str, Any]] = [
                ("create:ray_actor", (new_actor, actor_split[index])),
                ("create:stickless", (new_session, session_split[index])),
            ]
            shift = index % 2
            for name, (make, count) in steps[shift:] + steps[:shift]:
                create[name.split(":")[1]].append([await _timed(make) for _ in range(count)])
            contenders: dict[str, list[Any]] = {
                "ray_actor": [actor_call(i) for i in range(len(actors))],
                "stickless_local": [stickless_call(s) for s in local_sessions],
                "stickless_forwarded": [stickless_call(fwd_session)],
                "ray_call_router_ping": [lambda: local.ping.remote()],
            }
            names = list(contenders)
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(await _latencies(contenders[name], per_round))
            ctx.progress(f"round {index + 1}/{rounds}: {len(actors)} actors, "
                         f"{len(local_sessions)} sessions")  # fmt: skip

        # Memory: every actor's worker process; the router's RSS over N more idle sessions.
        pids = [int(p) for p in await asyncio.gather(*(a.pid.remote() for a in actors))]
        actor_uss = [uss_bytes(pid) for pid in pids]
        actor_rss = [rss_bytes_of(pid) for pid in pids]
        extra = max(0, config["idle_sessions"] - len(local_sessions) - len(warm))
        rss_before, uss_before = rss_bytes_of(router_pid), uss_bytes(router_pid)
        redis_before = await _redis_used(ctx.redis_url)
        queue = [ctx.unique("ray-idle-") for _ in range(extra)]

        async def creator() -> None:
            while queue:
                session = queue.pop()
                await local.run.remote(request(session))

        t0 = time.perf_counter()
        await asyncio.gather(*(creator() for _ in range(_CREATORS)))
        bulk_s = time.perf_counter() - t0
        await asyncio.sleep(0.5)  # let post-turn bookkeeping settle
        rss_after, uss_after = rss_bytes_of(router_pid), uss_bytes(router_pid)
        redis_after = await _redis_used(ctx.redis_url)
        held = extra + len(local_sessions) + len(warm)
        ctx.progress(f"memory: {len(actors)} actor processes, {held} stickless sessions")
        return {
            "deploy_s": round(deploy_s, 2),
            "mem_available_bytes": available,
            "create_ms": {name: summarize(flatten(g), g) for name, g in create.items()},
            "latency_ms": {name: summarize(flatten(g), g) for name, g in samples.items()},
            "memory": {
                "actor_uss_bytes": value_spread(actor_uss),
                "actor_rss_bytes": value_spread(actor_rss),
                "actor_processes": len(pids),
                "router_rss_bytes_before": rss_before,
                "router_rss_bytes_after": rss_after,
                "router_uss_bytes_after": uss_after,
                "stickless_sessions_added": extra,
                "stickless_sessions_held": held,
                "router_rss_per_session_bytes": rounded((rss_after - rss_before) / extra)
                if extra
                else None,
                "router_uss_per_session_bytes": rounded((uss_after - uss_before) / extra)
                if extra
                else None,
                "redis_used_per_session_bytes": rounded((redis_after - redis_before) / extra)
                if extra
                else None,
            },
            "stickless_new_sessions_per_s": rounded(extra / bulk_s) if extra else None,
        }
    finally:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        t0 = time.monotonic()
        undeploy(namespace, grace=1.0)
        ctx.progress(f"undeployed in {time.monotonic() - t0:.1f}s")


async def _armed(handles: dict[str, Any], within: float = 30.0) -> None:
    """Wait (bounded) until every router watches every other router."""
    deadline = time.monotonic() + within
    nodes = list(handles)
    while True:
        pings = await asyncio.gather(*(handles[n].ping.remote() for n in nodes))
        ids = [str(p["node_id"]) for p in pings]
        watching = await asyncio.gather(*(handles[n].watching.remote() for n in nodes))
        if all(set(ids) - {own} <= set(seen) for own, seen in zip(ids, watching, strict=True)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the routers did not start watching each other")
        await asyncio.sleep(0.1)


async def _failover(ctx: BenchContext, head: str, worker: str, fast: bool) -> dict[str, Any]:
    """One trial: ray.kill of the holder's router while the head's router waits on a forwarded
    long turn; seconds from the kill to the caller's HOLDER_LOST and to the next turn served."""
    import ray

    from ..ray import deploy, undeploy

    namespace = ctx.unique("bench-rayfo-")
    handles = deploy(
        ctx.redis_url,
        BENCH_OPENER,
        namespace,
        fast_failover=fast,
        reconcile_interval=0.5,
        **SHORT,
    )
    try:
        if fast:
            await _armed(handles)
        caller, holder = handles[head], handles[worker]
        holder_id = str((await holder.ping.remote())["node_id"])
        session = ctx.unique("ray-fo-")
        await holder.run.remote(request(session))  # the worker's router claims it
        ticket = await caller.submit.remote(request(session, "sleep:600"))
        if ticket.kind != "FORWARDED":
            raise RuntimeError(f"the long turn was not forwarded ({ticket.kind})")
        deadline = time.monotonic() + 30
        while (await holder.status.remote(session)).active_turn_id != ticket.turn_id:
            if time.monotonic() > deadline:
                raise RuntimeError("the long turn did not start on the holder")
            await asyncio.sleep(0.02)
        killed = time.monotonic()
        ray.kill(holder)
        next_turn = asyncio.ensure_future(caller.run.remote(request(session)))
        outcome = "completed"
        try:
            await asyncio.wait_for(caller.result.remote(ticket.turn_id), 60)
        except TurnFailedError as exc:
            outcome = exc.code.value
        lost_s = time.monotonic() - killed
        served = await asyncio.wait_for(next_turn, 60)
        served_s = time.monotonic() - killed
        revoked = await caller.failover_times.remote()
        bounds = _bounds(SHORT)
        return {
            "fast_failover": fast,
            "outcome": outcome,
            "kill_to_holder_lost_s": rounded(lost_s),
            "kill_to_next_turn_s": rounded(served_s),
            "next_turn_executed_by_holder": served.executed_by == holder_id,
            "peer_revoke_s": rounded(revoked[holder_id]) if holder_id in revoked else None,
            "holder_lost_bound_s": bounds["holder_lost_bound_s"],
        }
    finally:
        undeploy(namespace, grace=1.0)


# ====================================================================== report


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value / 1e6, 1)


def _report(config: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    latency = results["latency_ms"]
    create = results["create_ms"]
    memory = results["memory"]
    available = results["mem_available_bytes"]
    actor = latency["ray_actor"]
    per_actor = memory["actor_uss_bytes"].get("p50")
    per_session = memory["router_rss_per_session_bytes"]
    redis_share = memory["redis_used_per_session_bytes"]
    ray_capacity = int(available / per_actor) if per_actor else None
    stickless_capacity = int(available / per_session) if per_session and per_session > 0 else None
    with_redis = (per_session or 0) + (redis_share or 0)
    stickless_with_redis = int(available / with_redis) if with_redis > 0 else None
    ratios: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for name in ("stickless_local", "stickless_forwarded"):
        for q in ("p50", "p95", "p99"):
            value = ratio(latency[name][q], actor[q])
            ratios[f"{name}_{q}"] = value
            rows.append(
                [
                    f"{name} warm turn {q} (ms) vs a Ray actor call",
                    latency[name][q],
                    actor[q],
                    value,
                ]
            )
    ping = latency["ray_call_router_ping"]
    rows.append(
        ["bare Ray call to the router actor (ping) p50 / p95 (ms)", "-",
         f"{ping['p50']:.3f} / {ping['p95']:.3f}", None]
    )  # fmt: skip
    for q in ("p50", "max"):
        value = ratio(create["stickless"][q], create["ray_actor"][q])
        ratios[f"create_{q}"] = value
        rows.append(
            [f"new session {q} (ms): first turn vs named actor create + first call",
             create["stickless"][q], create["ray_actor"][q], value]
        )  # fmt: skip
    mem_ratio = round(per_session / per_actor, 6) if per_session and per_actor else None
    ratios["memory_per_session"] = mem_ratio
    rows.append(
        ["memory per session (B): router RSS delta / actor process USS (p50)",
         per_session, per_actor, f"1/{per_actor / per_session:,.0f}" if mem_ratio else None]
    )  # fmt: skip
    rows.append(["Redis used_memory per session (B)", redis_share, "-", None])
    rows.append(
        ["actor process USS min..max (MB)", "-",
         f"{_mb(memory['actor_uss_bytes'].get('min'))}..{_mb(memory['actor_uss_bytes'].get('max'))}",
         None]
    )  # fmt: skip
    capacity_ratio = ratio(stickless_capacity, ray_capacity)
    shown = [None if c is None else float(c) for c in (stickless_capacity, stickless_with_redis)]
    ratios["sessions_per_node"] = capacity_ratio
    rows.append(
        [f"sessions per node, EXTRAPOLATED from MemAvailable {available / 1e9:.1f} GB",
         shown[0], ray_capacity, capacity_ratio]
    )  # fmt: skip
    rows.append(
        ["  the same, counting Redis memory on the node too", shown[1], ray_capacity,
         ratio(stickless_with_redis, ray_capacity)]
    )  # fmt: skip
    rows.append(
        [f"new sessions/s, {_CREATORS} concurrent callers", results["stickless_new_sessions_per_s"],
         "-", None]
    )  # fmt: skip
    for label, trial in results.get("failover", {}).items():
        rows.append(
            [f"ray.kill holder router -> caller's {trial['outcome']} (s), {label}",
             trial["kill_to_holder_lost_s"], f"<= {trial['holder_lost_bound_s']} (TTL bound)",
             ratio(trial["kill_to_holder_lost_s"], trial["holder_lost_bound_s"])]
        )  # fmt: skip
        rows.append(
            [f"ray.kill holder router -> next turn served (s), {label}",
             trial["kill_to_next_turn_s"], "-", None]
        )  # fmt: skip
    fwd = ratios.get("stickless_forwarded_p50")
    goals = [
        {
            "goal": "forwarded turn p50 below a Ray actor call (p50)",
            "target": "< 1.0",
            "measured": fwd,
            "met": None if fwd is None else fwd < 1.0,
        }
    ]
    notes = [
        f"{config['rounds']} rounds, contenders interleaved (order rotates); "
        f"{config['calls_per_round']} sequential calls per contender per round",
        f"per-session actors capped at {config['actors']} (each is a new worker process, "
        "~1 s to create); stickless: "
        f"{config['timed_sessions']} timed first turns, {memory['stickless_sessions_held']} "
        "sessions held for the memory measurement",
        "sessions per node is an EXTRAPOLATION (MemAvailable / measured per-session memory), "
        "not a run to exhaustion; Ray's own per-actor cost in the raylet/GCS and per-node "
        "process limits are not counted, nor stickless's router process itself "
        f"({_mb(memory['router_uss_bytes_after'])} MB USS, one per node)",
        "Ray itself warns (raylet, on stderr) that N worker processes were started, N times its "
        "expected startup concurrency: every per-session actor is one more worker process",
        "every stickless turn here includes one Ray actor call (driver -> router actor): "
        f"the bare call (ping) is {ping['p50']:.3f} ms p50",
        f"cluster: {config['ray_nodes']} Ray nodes on 127.0.0.1 (1 CPU each), started in "
        f"{config['cluster_start_s']}s; routers deployed in {results['deploy_s']}s",
    ]
    return {
        "config": config,
        "results": results,
        "ratios": ratios,
        "rows": rows,
        "goals": goals,
        "notes": notes,
    }
