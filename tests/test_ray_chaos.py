"""Chaos on a local 3-node Ray cluster: router actors killed and whole nodes removed mid-turn.

One loopback Ray cluster serves the module. The routers run `tests.ray_agent.LoggedSession`,
which logs every execution (start/end, Redis `TIME`, the Ray actor that ran it) to a Redis list
the test reads directly. The tests measure and print how long a caller waits for `HOLDER_LOST`
after the crash and how long until the session's next turn is served on a survivor, with fast
failover (peer routers learn of the death from Ray) and, for comparison, TTL-only detection.
The randomized storm kills routers while clients submit through random routers and retry on
`any_router()` with the same idempotency key when their own router dies, then checks the
invariants of DESIGN.md §8 and prints what it counted. The only timing bound asserted is the
configured one: lease TTL + secondary TTL + sweep interval + slack.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from stickless import CommittedEntry, FailureCode, TurnFailedError, TurnResult

from .ray_agent import ExecutionRecord, read_log
from .ray_cluster import (
    add_worker,
    head_id,
    ray_cluster,  # noqa: F401  (fixture)
    remove_worker,
    wait_for,
    worker_ids,
)
from .redis_fixture import RedisServer

pytestmark = pytest.mark.timeout(300)

TIMINGS: dict[str, float] = dict(
    lease_ttl=3.0,
    lease_extend_interval=1.0,
    idempotency_secondary_ttl=3.0,
    holder_loss_sweep_interval=1.0,
    status_heartbeat_interval=1.0,
    forward_ttl=30.0,
    release_interrupt_timeout=2.0,
    interrupt_grace=0.5,
)
SLACK = 5.0
#: The configured bound on learning that a holder died: its lease and its reservation run out
#: and a sweep finds them (fast failover is much quicker; this is the TTL-only worst case).
LOSS_BOUND = (
    TIMINGS["lease_ttl"]
    + TIMINGS["idempotency_secondary_ttl"]
    + TIMINGS["holder_loss_sweep_interval"]
    + SLACK
)
#: How long a caller may wait for any answer (a forward's own deadline, plus slack).
ANSWER_BOUND = TIMINGS["forward_ttl"] + SLACK
#: Generous bounds for Ray itself (starting a worker process on a busy 2-CPU box).
RAY_BOUND = 60.0
RECONCILE_INTERVAL = 0.5
OPENER = "tests.ray_agent:make_logged_opener"

#: Failover measurements by scenario, printed together by the TTL-only test.
MEASURED: dict[str, dict[str, float]] = {}


# ====================================================================== deployment helpers


@dataclass
class Deployment:
    """One deploy() of the routers, with the Redis list its agents log executions to."""

    namespace: str
    redis_url: str
    log_key: str = field(default_factory=lambda: f"chaos-log:{uuid.uuid4().hex[:8]}")

    def request(
        self, session: str, tag: str, hold: float = 0.0, key: str | None = None
    ) -> dict[str, Any]:
        """A submit whose idempotency key is `tag` unless given; `hold`: seconds the turn
        lasts (-1: until interrupted)."""
        return {
            "session_id": session,
            "agent_ref": "bot",
            "input": f"{session}|{tag}",
            "idempotency_key": key or tag,
            "submit_options": {
                "log_url": self.redis_url,
                "log_key": self.log_key,
                "tag": tag,
                "hold": hold,
            },
        }

    def routers(self) -> dict[str, Any]:
        from stickless.ray import routers

        return routers(self.namespace)

    def log(self) -> list[ExecutionRecord]:
        import redis

        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            return read_log(client, self.log_key)
        finally:
            client.close()

    def redis_time(self) -> float:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            seconds, micros = client.time()
            return float(seconds) + micros / 1e6
        finally:
            client.close()

    def entries(self, session: str) -> list[CommittedEntry]:
        return asyncio.run(_entries(self.redis_url, self.namespace, [session]))[session]


async def _entries(url: str, namespace: str, sessions: list[str]) -> dict[str, list[Any]]:
    from stickless.backends.redis import RedisBackends

    backends = RedisBackends.from_url(url, namespace=namespace)
    try:
        found: dict[str, list[Any]] = {}
        for session in sessions:
            view = await backends.records.load(session)
            found[session] = list(view.entries) if view is not None else []
        return found
    finally:
        await backends.aclose()


def node_id(handle: Any) -> str:
    import ray

    return str(ray.get(handle.ping.remote(), timeout=10)["node_id"])


def armed(namespace: str) -> bool:
    """Every router watches every other router (fast failover is armed for all of them)."""
    import ray

    from stickless.ray import routers

    handles = list(routers(namespace).values())
    ids = [p["node_id"] for p in ray.get([h.ping.remote() for h in handles], timeout=10)]
    watching = ray.get([h.watching.remote() for h in handles], timeout=10)
    return len(handles) == len(_alive()) and all(
        set(ids) - {own} <= set(seen) for own, seen in zip(ids, watching, strict=True)
    )


def _alive() -> list[str]:
    import ray

    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


def wait_armed(namespace: str) -> None:
    wait_for(lambda: armed(namespace), RAY_BOUND, "every router watches its peers")


def replaced(namespace: str, ray_node: str, old: str) -> Callable[[], str | None]:
    """Probe: the node id of the router now on `ray_node` once it is not `old`."""

    def probe() -> str | None:
        from stickless.ray import routers

        handle = routers(namespace).get(ray_node)
        if handle is None:
            return None
        current = node_id(handle)
        return current if current != old else None

    return probe


def answer(handle: Any, turn_id: str, timeout: float) -> TurnResult | TurnFailedError:
    """The result of a turn submitted on `handle`, or its failure (ray.get raises past
    `timeout`: a caller left hanging fails the test)."""
    import ray

    try:
        result: TurnResult = ray.get(handle.result.remote(turn_id), timeout=timeout)
    except TurnFailedError as exc:
        return exc
    return result


def deploy_routers(redis_url: str, fast_failover: bool = True) -> Deployment:
    from stickless.ray import deploy

    deployment = Deployment(f"chaos{uuid.uuid4().hex[:6]}", redis_url)
    deploy(
        redis_url,
        OPENER,
        deployment.namespace,
        fast_failover=fast_failover,
        reconcile_interval=RECONCILE_INTERVAL,
        **TIMINGS,
    )
    if fast_failover:
        wait_armed(deployment.namespace)
    return deployment


@pytest.fixture(scope="module")
def fast(ray_cluster: Any, redis_server: RedisServer) -> Iterator[Deployment]:  # noqa: F811
    """Routers with fast failover, shared by the module's tests."""
    from stickless.ray import undeploy

    deployment = deploy_routers(redis_server.url)
    try:
        yield deployment
    finally:
        undeploy(deployment.namespace, grace=1.0)


# ====================================================================== crash mid-turn


def crash_mid_turn(
    deployment: Deployment,
    session: str,
    holder_node: str,
    caller_node: str,
    crash: Callable[[Any], None],
) -> tuple[str, float, dict[str, float]]:
    """Warm `session` on the router of `holder_node`, forward a never-ending turn to it from
    the router of `caller_node`, `crash(holder_handle)` once that turn runs, and check the
    caller's HOLDER_LOST, the next turn on a survivor and the committed transcript.

    Returns the crashed router's node id, the crash instant (monotonic) and the measured
    seconds after it.
    """
    import ray

    handles = deployment.routers()
    holder, caller = handles[holder_node], handles[caller_node]
    holder_id = node_id(holder)
    warm = ray.get(holder.run.remote(deployment.request(session, "warm")), timeout=RAY_BOUND)
    assert warm.executed_by == holder_id
    ticket = ray.get(
        caller.submit.remote(deployment.request(session, "long", hold=-1)), timeout=RAY_BOUND
    )
    assert ticket.kind == "FORWARDED", ticket
    # Crash only once the turn runs on the holder (before that, a survivor would just run it).
    wait_for(
        lambda: ray.get(holder.status.remote(session), timeout=5).active_turn_id == ticket.turn_id,
        RAY_BOUND,
        "the long turn runs on the holder",
    )
    crashed = time.monotonic()
    crash(holder)
    outcome = answer(caller, ticket.turn_id, LOSS_BOUND)
    lost_after = time.monotonic() - crashed
    assert isinstance(outcome, TurnFailedError), outcome
    assert outcome.code is FailureCode.HOLDER_LOST, outcome
    following = ray.get(caller.run.remote(deployment.request(session, "next")), timeout=LOSS_BOUND)
    served_after = time.monotonic() - crashed
    current = {node_id(h) for h in deployment.routers().values()}
    assert following.executed_by != holder_id
    assert following.executed_by in current, (following.executed_by, current)
    # Only the holder's committed turns are in the transcript: the lost turn committed nothing.
    entries = deployment.entries(session)
    assert [e.content for e in entries] == [f"{session}|warm", f"{session}|next"], entries
    assert entries[0].token < entries[1].token
    # The agent's log: the long turn started on the crashed router and never ended.
    log = [r for r in deployment.log() if r.session_id == session]
    assert [(r.tag, r.phase) for r in log] == [
        ("warm", "start"),
        ("warm", "end"),
        ("long", "start"),
        ("next", "start"),
        ("next", "end"),
    ], log
    return holder_id, crashed, {"holder_lost": lost_after, "next_served": served_after}


def _print_times(label: str, times: dict[str, float]) -> None:
    print(
        f"\n[{label}] crash -> caller's HOLDER_LOST {times['holder_lost']:.3f}s; "
        f"crash -> next turn served {times['next_served']:.3f}s"
        + (f"; crash -> router recreated {times['recreated']:.3f}s" if "recreated" in times else "")
    )


def test_killing_the_holder_router_mid_turn(fast: Deployment, ray_cluster: Any) -> None:  # noqa: F811
    import ray

    holder_node, caller_node = worker_ids(ray_cluster)[0], head_id(ray_cluster)
    holder_id, crashed, times = crash_mid_turn(fast, "a1", holder_node, caller_node, ray.kill)
    # The reconciler gives the still-alive node a new router: a new incarnation.
    new_id = wait_for(
        replaced(fast.namespace, holder_node, holder_id), RAY_BOUND, "the router is recreated"
    )
    times["recreated"] = time.monotonic() - crashed
    assert new_id.split("/")[0] == holder_id.split("/")[0] == holder_node
    assert new_id != holder_id
    fresh = ray.get(fast.routers()[holder_node].run.remote(fast.request("a2", "hello")))
    assert fresh.executed_by == new_id
    revoke = [ray.get(h.failover_times.remote()) for h in fast.routers().values()]
    noticed = [t[holder_id] for t in revoke if holder_id in t]
    assert noticed, revoke  # the surviving peers heard of the death and revoked at once
    MEASURED["ray.kill, fast failover"] = times
    _print_times("ray.kill, fast failover", times)
    print(f"  peers: death notice -> leases revoked in {', '.join(f'{t:.3f}s' for t in noticed)}")
    wait_armed(fast.namespace)


def test_killing_the_holder_router_ttl_only(
    ray_cluster: Any,  # noqa: F811
    redis_server: RedisServer,
) -> None:
    import ray

    from stickless.ray import undeploy

    deployment = deploy_routers(redis_server.url, fast_failover=False)
    try:
        holder_node, caller_node = worker_ids(ray_cluster)[1], head_id(ray_cluster)
        _, _, times = crash_mid_turn(deployment, "t1", holder_node, caller_node, ray.kill)
        revoke = [ray.get(h.failover_times.remote()) for h in deployment.routers().values()]
        assert not any(revoke), revoke  # nobody was watching: the TTLs did the work
    finally:
        undeploy(deployment.namespace, grace=1.0)
    MEASURED["ray.kill, TTL only"] = times
    _print_times("ray.kill, TTL only (lease 3s, secondary 3s, sweep 1s)", times)
    fast_times = MEASURED.get("ray.kill, fast failover")
    if fast_times is not None:
        print(
            f"  fast failover vs TTL only: HOLDER_LOST {fast_times['holder_lost']:.3f}s vs "
            f"{times['holder_lost']:.3f}s, next turn {fast_times['next_served']:.3f}s vs "
            f"{times['next_served']:.3f}s"
        )


def test_removing_the_holder_node_mid_turn(fast: Deployment, ray_cluster: Any) -> None:  # noqa: F811
    import ray

    holder_node, caller_node = worker_ids(ray_cluster)[-1], head_id(ray_cluster)

    def remove(_: Any) -> None:
        remove_worker(ray_cluster, holder_node)

    from stickless.ray._deploy import RECONCILER_NAME

    # The reconciler lives on the head node, so removing a worker cannot take it along.
    reconciler = ray.get_actor(RECONCILER_NAME, namespace=fast.namespace)
    assert ray.get(reconciler.ray_node.remote(), timeout=10) == head_id(ray_cluster)
    _, _, times = crash_mid_turn(fast, "b1", holder_node, caller_node, remove)
    assert holder_node not in fast.routers()
    MEASURED["remove_node, fast failover"] = times
    _print_times("cluster.remove_node, fast failover", times)
    # A node that joins gets its own router from the reconciler (which lives on the head node).
    started = time.monotonic()
    added = add_worker(ray_cluster)
    router_id = wait_for(
        lambda: node_id(fast.routers()[added]), RAY_BOUND, "a router on the added node"
    )
    assert router_id.startswith(added + "/")
    assert len(fast.routers()) == 3
    result = ray.get(fast.routers()[added].run.remote(fast.request("b2", "hello")))
    assert result.executed_by == router_id
    print(f"  add_node -> its router served a turn {time.monotonic() - started:.3f}s later")
    wait_armed(fast.namespace)


def test_ray_deploy_command_leaves_a_self_healing_deployment(
    ray_cluster: Any,  # noqa: F811
    redis_server: RedisServer,
) -> None:
    """`stickless ray-deploy` (as cluster.yaml runs it) from a short-lived driver process: the
    routers and the reconciler outlive it; `stickless ray-undeploy` removes them."""
    import ray

    from stickless.ray import routers

    namespace = f"cli{uuid.uuid4().hex[:6]}"
    common = ["--namespace", namespace, "--address", ray_cluster.address]
    deployed = subprocess.run(
        [
            sys.executable, "-m", "stickless", "ray-deploy",
            "--redis", redis_server.url,
            "--opener", OPENER,
            "--config", json.dumps(TIMINGS),
            "--reconcile-interval", str(RECONCILE_INTERVAL),
            *common,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert f"DEPLOYED 3 router(s) in namespace {namespace}" in deployed.stdout
    deployment = Deployment(namespace, redis_server.url)
    try:
        handles = routers(namespace)
        assert len(handles) == 3
        node = sorted(handles)[0]
        first = ray.get(handles[node].run.remote(deployment.request("d1", "hi")), timeout=30)
        old = first.executed_by
        # The deploying driver has exited; its reconciler still replaces a killed router.
        ray.kill(handles[node])
        new = wait_for(replaced(namespace, node, old), RAY_BOUND, "the router is recreated")
        assert new.startswith(node + "/") and new != old
    finally:
        undeployed = subprocess.run(
            [sys.executable, "-m", "stickless", "ray-undeploy", "--grace", "1", *common],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert undeployed.returncode == 0, undeployed.stdout + undeployed.stderr
    assert routers(namespace) == {}


# ====================================================================== randomized storm

SESSIONS = [f"r{i}" for i in range(8)]
CLIENTS = 6
KILLS = 4
#: Seconds a turn lasts, chosen per request.
HOLDS = (0.0, 0.05, 0.2, 0.5)
#: How often a client repeats an earlier request (same key, same input) instead of a new one.
REPEAT = 0.2
SEED = 20260


@dataclass
class Op:
    """One logical submit: retried on another router, same key, when its own router dies."""

    index: int
    session: str
    tag: str
    request: dict[str, Any]
    repeat: bool
    router_deaths: int = 0
    answer: str | None = None  # "ok", a FailureCode value, or "hung"
    turn_id: str | None = None
    text: str | None = None
    answered_at: float = 0.0  # monotonic


@dataclass
class Kill:
    ray_node: str
    node_id: str
    actor: str
    redis_time: float
    mid_turn: bool
    at: float = 0.0  # monotonic
    recreated_as: str = ""
    recreated_after: float = 0.0


@dataclass
class Storm:
    deployment: Deployment
    rng: random.Random
    ops: list[Op] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    dead: set[str] = field(default_factory=set)

    def pick(self) -> Any:
        """A random live router, as application code would get from `any_router()`."""
        from stickless.ray import any_router

        return wait_for(
            lambda: _live(any_router(self.deployment.namespace), self.dead),
            RAY_BOUND,
            "a live router",
        )

    async def run_op(self, op: Op) -> None:
        try:
            await self._run_op(op)
        finally:
            op.answered_at = time.monotonic()

    async def _run_op(self, op: Op) -> None:
        handle = self.pick()
        deadline = time.monotonic() + ANSWER_BOUND
        while time.monotonic() < deadline:
            try:
                ticket = await asyncio.wait_for(handle.submit.remote(op.request), ANSWER_BOUND)
                result = await asyncio.wait_for(handle.result.remote(ticket.turn_id), ANSWER_BOUND)
            except TurnFailedError as exc:
                op.answer = exc.code.value
                op.turn_id = exc.turn_id
                return
            except TimeoutError:
                op.answer = "hung"
                return
            except Exception as exc:
                from ray.exceptions import RayActorError

                if not isinstance(exc, RayActorError):
                    raise
                # Our own router died (ActorDiedError): retry elsewhere with the same key.
                op.router_deaths += 1
                self.dead.add(handle._actor_id.hex())
                handle = self.pick()
                continue
            op.answer, op.turn_id, op.text = "ok", result.turn_id, result.text
            return
        op.answer = "hung"

    async def client(self, number: int, stop: asyncio.Event) -> None:
        rng = random.Random(self.rng.random())
        issued: list[Op] = []
        while not stop.is_set():
            if issued and rng.random() < REPEAT:
                earlier = rng.choice(issued)
                op = Op(len(self.ops), earlier.session, earlier.tag, earlier.request, True)
            else:
                session = rng.choice(SESSIONS)
                tag = f"c{number}-{len(issued)}"
                request = self.deployment.request(session, tag, hold=rng.choice(HOLDS))
                op = Op(len(self.ops), session, tag, request, False)
                issued.append(op)
            self.ops.append(op)
            await self.run_op(op)

    def victim(self) -> tuple[str, Any, bool]:
        """A router with a turn running on it right now if there is one, else any router."""
        handles = self.deployment.routers()
        by_actor = {h._actor_id.hex(): (node, h) for node, h in handles.items()}
        running: dict[str, str] = {}
        for record in self.deployment.log():
            if record.phase == "start":
                running[record.turn_id] = record.actor
            else:
                running.pop(record.turn_id, None)
        busy = sorted({a for a in running.values() if a in by_actor and a not in self.dead})
        if busy:
            node, handle = by_actor[self.rng.choice(busy)]
            return node, handle, True
        node = self.rng.choice(sorted(handles))
        return node, handles[node], False

    async def killer(self, stop: asyncio.Event) -> None:
        import ray

        namespace = self.deployment.namespace
        try:
            for _ in range(KILLS):
                await asyncio.sleep(self.rng.uniform(1.0, 2.0))  # pacing, not synchronisation
                ray_node, handle, mid_turn = self.victim()
                old = node_id(handle)
                kill = Kill(
                    ray_node, old, handle._actor_id.hex(), self.deployment.redis_time(), mid_turn
                )
                killed_at = kill.at = time.monotonic()
                ray.kill(handle)
                self.dead.add(kill.actor)
                self.kills.append(kill)
                kill.recreated_as = await asyncio.to_thread(
                    wait_for, replaced(namespace, ray_node, old), RAY_BOUND, "recreated router"
                )
                kill.recreated_after = time.monotonic() - killed_at
                await asyncio.to_thread(wait_armed, namespace)
        finally:
            stop.set()

    async def run(self) -> None:
        stop = asyncio.Event()
        await asyncio.gather(self.killer(stop), *(self.client(i, stop) for i in range(CLIENTS)))


def _live(handle: Any, dead: set[str]) -> Any:
    return None if handle._actor_id.hex() in dead else handle


@dataclass
class Execution:
    session: str
    turn_id: str
    tag: str
    actor: str
    start: float
    end: float | None = None
    phase: str = "running"


class Checker:
    """DESIGN.md §8 over the storm's answers, the agents' log and the committed transcripts."""

    def __init__(self, storm: Storm) -> None:
        self.storm = storm
        self.failures: list[str] = []
        self.counts: Counter[str] = Counter()
        self.slowest_holder_lost = 0.0

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def check(self) -> None:
        storm = self.storm
        killed = {k.actor: k.redis_time for k in storm.kills}
        executions = self.executions(killed)
        committed = self.transcripts(executions)
        self.no_overlap(executions, killed)
        self.answers()
        self.at_most_once(executions, committed, killed)
        self.counts["kills"] = len(storm.kills)
        self.counts["kills_mid_turn"] = sum(1 for k in storm.kills if k.mid_turn)

    def executions(self, killed: dict[str, float]) -> dict[str, Execution]:
        found: dict[str, Execution] = {}
        for record in self.storm.deployment.log():
            if record.session_id not in SESSIONS:
                continue
            if record.phase == "start":
                if record.turn_id in found:
                    self.fail(f"turn {record.turn_id} started twice")
                found[record.turn_id] = Execution(
                    record.session_id, record.turn_id, record.tag, record.actor, record.time
                )
            else:
                execution = found[record.turn_id]
                execution.end, execution.phase = record.time, record.phase
        for execution in found.values():
            if execution.end is None and execution.actor not in killed:
                self.fail(f"turn {execution.turn_id} on a live router never ended")
        self.counts["executions"] = len(found)
        self.counts["executions_cut_by_kill"] = sum(1 for e in found.values() if e.end is None)
        return found

    def no_overlap(self, executions: dict[str, Execution], killed: dict[str, float]) -> None:
        """Invariant 1: a session's turns never ran at the same time. A turn cut short by a
        kill is counted as running until the kill was issued (after that its router may have
        lived a few more milliseconds, the window the invariant allows)."""
        by_session: dict[str, list[Execution]] = defaultdict(list)
        for execution in executions.values():
            by_session[execution.session].append(execution)
        for session, runs in by_session.items():
            runs.sort(key=lambda e: e.start)
            busy_until, busy_turn = 0.0, ""
            for run in runs:
                end = run.end if run.end is not None else killed[run.actor]
                if run.start < busy_until:
                    self.fail(f"{session}: turn {run.turn_id} started while {busy_turn} ran")
                if end > busy_until:
                    busy_until, busy_turn = end, run.turn_id

    def transcripts(self, executions: dict[str, Execution]) -> dict[str, list[str]]:
        """Invariant 1 on the record store: fencing tokens never decrease, a turn's entries
        are contiguous, and only turns that ran to their end committed. Returns the committed
        turn ids per (session, tag)."""
        deployment = self.storm.deployment
        stored = asyncio.run(_entries(deployment.redis_url, deployment.namespace, SESSIONS))
        committed: dict[str, list[str]] = defaultdict(list)
        for session, entries in stored.items():
            last_token, blocks = 0, []
            for entry in entries:
                if entry.token < last_token:
                    self.fail(f"{session}: token {entry.token} after {last_token}")
                last_token = max(last_token, entry.token)
                if not blocks or blocks[-1] != entry.turn_id:
                    blocks.append(entry.turn_id)
                execution = executions.get(entry.turn_id)
                if execution is None or execution.phase != "end":
                    self.fail(f"{session}: turn {entry.turn_id} committed but did not end")
                    continue
                if entry.content != f"{session}|{execution.tag}":
                    self.fail(f"{session}: {entry.content!r} committed by {entry.turn_id}")
                committed[f"{session}|{execution.tag}"].append(entry.turn_id)
            for turn_id, times in Counter(blocks).items():
                if times > 1:
                    self.fail(f"{session}: turn {turn_id} interleaved ({times} blocks)")
            self.counts["transcript_entries"] += len(entries)
        return committed

    def answers(self) -> None:
        """Invariant 2: every submit got exactly one terminal answer, none hung."""
        codes = Counter(op.answer for op in self.storm.ops)
        for op in self.storm.ops:
            if op.answer is None or op.answer == "hung":
                self.fail(f"op {op.index} ({op.session}|{op.tag}) got no answer")
            elif op.answer not in ("ok", FailureCode.HOLDER_LOST.value):
                self.fail(f"op {op.index} ({op.session}|{op.tag}) answered {op.answer}")
            elif op.answer == "ok" and op.text != f"done:{op.tag}":
                self.fail(f"op {op.index} ({op.session}|{op.tag}) got {op.text!r}")
        self.counts["submits"] = len(self.storm.ops)
        self.counts["repeated_keys"] = sum(1 for op in self.storm.ops if op.repeat)
        self.counts["answered_ok"] = codes["ok"]
        self.counts["answered_holder_lost"] = codes[FailureCode.HOLDER_LOST.value]
        self.counts["router_died_under_caller"] = sum(op.router_deaths for op in self.storm.ops)
        self.counts["retried_ok"] = sum(
            1 for op in self.storm.ops if op.router_deaths and op.answer == "ok"
        )
        # HOLDER_LOST reaches the caller within the configured bound after the kill behind it.
        lost_after: list[float] = []
        for op in self.storm.ops:
            if op.answer != FailureCode.HOLDER_LOST.value:
                continue
            before = [k.at for k in self.storm.kills if k.at <= op.answered_at]
            if not before:
                self.fail(f"op {op.index} answered HOLDER_LOST before any kill")
                continue
            lost_after.append(op.answered_at - max(before))
            if lost_after[-1] > LOSS_BOUND:
                self.fail(f"op {op.index}: HOLDER_LOST {lost_after[-1]:.2f}s after the kill")
        self.slowest_holder_lost = max(lost_after, default=0.0)

    def at_most_once(
        self,
        executions: dict[str, Execution],
        committed: dict[str, list[str]],
        killed: dict[str, float],
    ) -> None:
        """Invariant 3: a key succeeds at most once; every successful answer names that turn.
        (A second run is legitimate only after the first one's holder died: its caller was
        told HOLDER_LOST, the reservation FAILED, and a retry runs fresh.)"""
        ok_turns: dict[str, set[str]] = defaultdict(set)
        for op in self.storm.ops:
            if op.answer == "ok" and op.turn_id is not None:
                ok_turns[f"{op.session}|{op.tag}"].add(op.turn_id)
        runs: dict[str, list[Execution]] = defaultdict(list)
        for execution in executions.values():
            runs[f"{execution.session}|{execution.tag}"].append(execution)
        for key in set(runs) | set(ok_turns):
            survived = [e for e in runs[key] if e.phase == "end" and e.actor not in killed]
            if len(survived) > 1:
                self.fail(f"{key} succeeded {len(survived)} times: {survived}")
            if len(ok_turns[key]) > 1:
                self.fail(f"{key} answered with different turns {sorted(ok_turns[key])}")
            for turn_id in ok_turns[key]:
                if turn_id not in committed.get(key, []):
                    self.fail(f"{key} answered ok by turn {turn_id}, which did not commit")
            extra = committed.get(key, [])[:-1]
            for turn_id in extra:
                # committed, then its holder died before recording DONE: a retry ran fresh
                if executions[turn_id].actor not in killed:
                    self.fail(f"{key} committed twice ({committed[key]})")
                self.counts["recommitted_after_holder_death"] += 1
            self.counts["keys_executed_more_than_once"] += int(len(runs[key]) > 1)
        self.counts["keys"] = len(set(runs) | set(ok_turns))
        self.counts["committed_turns"] = sum(len(t) for t in committed.values())


def test_randomized_router_kills_keep_the_invariants(fast: Deployment) -> None:
    storm = Storm(fast, random.Random(SEED))
    started = time.monotonic()
    asyncio.run(storm.run())
    elapsed = time.monotonic() - started
    checker = Checker(storm)
    checker.check()
    print(
        f"\n[randomized storm, seed {SEED}] {elapsed:.1f}s: "
        + ", ".join(f"{name}={value}" for name, value in sorted(checker.counts.items()))
    )
    print(f"  slowest HOLDER_LOST answer: {checker.slowest_holder_lost:.2f}s after its kill")
    for kill in storm.kills:
        print(
            f"  killed {kill.node_id} ({'mid-turn' if kill.mid_turn else 'idle'}); "
            f"recreated as .../{kill.recreated_as.rpartition('/')[2]} "
            f"{kill.recreated_after:.2f}s later"
        )
    assert not checker.failures, "\n".join(checker.failures)
    assert len(storm.kills) >= 3
    for kill in storm.kills:
        assert kill.recreated_as.startswith(kill.ray_node + "/")
        assert kill.recreated_as != kill.node_id
    assert checker.counts["answered_ok"] > 0
