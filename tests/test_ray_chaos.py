"""Chaos on a local 3-node Ray cluster: router actors killed and whole nodes removed mid-turn.

One loopback Ray cluster serves the module. The routers run `tests.ray_agent.LoggedSession`,
which logs every execution (start/end, Redis `TIME`, the Ray actor that ran it) to a Redis list
the test reads directly. The tests measure and print how long a caller waits for `HOLDER_LOST`
after the crash and how long until the session's next turn is served on a survivor, with fast
failover (peer routers learn of the death from Ray) and, for comparison, TTL-only detection.
The randomized storm kills routers while clients submit through random routers and retry on
`any_router()` with the same idempotency key when their own router dies (tests/storm/clients.py),
then checks the cluster's invariants with the storms' one checker (tests/storm/checker.py) and
prints what it counted. Nothing asserts on elapsed time: the failover times are printed (their
benchmark is `stickless bench --only ray`), and every wait for an answer is a hang guard derived
from the answer guarantee (forward_ttl + slack).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stickless import FailureCode, TurnFailedError, TurnResult

from .ray_cluster import (
    add_worker,
    head_id,
    ray_cluster,  # noqa: F401  (fixture)
    remove_worker,
    wait_for,
    worker_ids,
)
from .ray_deployment import (
    OPENER,
    RAY_BOUND,
    RECONCILE_INTERVAL,
    TIMINGS,
    Deployment,
    deploy_routers,
    node_id,
    replaced,
    wait_armed,
)
from .redis_fixture import RedisServer
from .storm.checker import Checker
from .storm.clients import ClientStorm
from .storm.ray import RayClients, RouterKill
from .storm.rules import Rules

pytestmark = pytest.mark.timeout(300)

SLACK = 5.0
#: The hang guard of every wait for an answer: each submit is answered within forward_ttl
#: (docs/architecture.md, invariant 2), plus slack. Not a speed bound.
ANSWER_BOUND = TIMINGS["forward_ttl"] + SLACK
#: Failover measurements by scenario, printed together by the TTL-only test.
MEASURED: dict[str, dict[str, float]] = {}


def answer(handle: Any, turn_id: str, timeout: float) -> TurnResult | TurnFailedError:
    """The result of a turn submitted on `handle`, or its failure (ray.get raises past
    `timeout`: a caller left hanging fails the test)."""
    import ray

    try:
        result: TurnResult = ray.get(handle.result.remote(turn_id), timeout=timeout)
    except TurnFailedError as exc:
        return exc
    return result


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
    outcome = answer(caller, ticket.turn_id, ANSWER_BOUND)
    lost_after = time.monotonic() - crashed
    # A running turn's reservation is its holder's, and a dead holder's goes stale after the
    # secondary TTL, well inside forward_ttl: the holder-loss answer, never FORWARD_TIMEOUT.
    assert isinstance(outcome, TurnFailedError), outcome
    assert outcome.code is FailureCode.HOLDER_LOST, outcome
    following = ray.get(
        caller.run.remote(deployment.request(session, "next")), timeout=ANSWER_BOUND
    )
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
RULES = Rules(
    # A caller gets its result, or HOLDER_LOST when the router running its turn was killed.
    allowed_codes=frozenset({FailureCode.HOLDER_LOST}),
    answer_within=ANSWER_BOUND,
    answer_text=lambda call: f"done:{call.tag}",
    executor=lambda result: str(result.data.get("actor") or "") or None,
    # (no lease is lost here but to a killed router: a HOLDER_LOST answer follows a kill)
    only_crashes_lose_holders=True,
    # (hang guards: a queued message runs or is withdrawn by its forward deadline, and an
    # answer is recorded before it is given)
    drain_within=ANSWER_BOUND,
    settle_within=ANSWER_BOUND,
)


async def check(checker: Checker, deployment: Deployment) -> None:
    from stickless.backends.redis import RedisBackends

    backends = RedisBackends.from_url(deployment.redis_url, namespace=deployment.namespace)
    try:
        await checker.check(backends)
    finally:
        await backends.aclose()


def test_randomized_router_kills_keep_the_invariants(fast: Deployment) -> None:
    cluster = RayClients(fast, HOLDS)
    storm = ClientStorm(
        SEED,
        cluster,
        SESSIONS,
        clients=CLIENTS,
        kills=KILLS,
        repeat=REPEAT,
        answer_within=ANSWER_BOUND,
    )
    started = time.monotonic()
    history = asyncio.run(storm.run())
    elapsed = time.monotonic() - started
    cluster.record(history)
    checker = Checker(history, RULES)
    asyncio.run(check(checker, fast))
    c = checker.counts
    counts = {
        "answered_holder_lost": c["answers"].get(FailureCode.HOLDER_LOST.value, 0),
        "answered_ok": c["answers"].get("ok", 0),
        "committed_turns": c["committed_turns"],
        "executions": c["executions"],
        "executions_cut_by_kill": c["executions_cut_by_kill"],
        "keys": c["keys"],
        "keys_executed_more_than_once": c["keys_executed_more_than_once"],
        "kills": len(history.kills),
        "kills_mid_turn": sum(k.mid_turn for k in history.kills),
        "recommitted_after_holder_death": c["recommitted_after_holder_loss"],
        "repeated_keys": c["repeats"],
        "reservations": c["reservations"],
        "retried_ok": c["retried_ok"],
        "router_died_under_caller": c["retries"],
        "submits": c["submits"],
        "transcript_entries": c["transcript_entries"],
    }
    print(
        f"\n[randomized storm, seed {SEED}] {elapsed:.1f}s: "
        + ", ".join(f"{name}={value}" for name, value in counts.items())
    )
    print(f"  slowest HOLDER_LOST answer: {checker.slowest_holder_lost:.2f}s after its kill")
    kills = [k for k in history.kills if isinstance(k, RouterKill)]
    for kill in kills:
        print(
            f"  killed {kill.router} ({'mid-turn' if kill.mid_turn else 'idle'}); "
            f"recreated as .../{kill.recreated_as.rpartition('/')[2]} "
            f"{kill.recreated_after:.2f}s later"
        )
    for hit in checker.known_bug:
        print(f"  known bug {hit.splitlines()[0]}")
    assert not checker.violations, checker.report()
    assert len(kills) >= 3
    for kill in kills:
        assert kill.recreated_as.startswith(kill.ray_node + "/")
        assert kill.recreated_as != kill.router
    assert counts["answered_ok"] > 0
