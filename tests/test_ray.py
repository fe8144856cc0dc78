"""The Ray deployment on a local 3-node cluster: one router per node, handles, fast failover."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from stickless import FailureCode, TurnFailedError, TurnState, is_terminal

from .faults.proxy import FaultProxy
from .ray_cluster import ray_cluster, wait_for  # noqa: F401  (fixture)
from .redis_fixture import RedisServer

pytestmark = pytest.mark.timeout(240)

TIMINGS = dict(
    lease_ttl=3.0,
    lease_extend_interval=1.0,
    idempotency_secondary_ttl=3.0,
    holder_loss_sweep_interval=1.0,
    forward_ttl=60.0,
)


def request(session: str, text: str, **kw: object) -> dict[str, object]:
    return {"session_id": session, "agent_ref": "bot", "input": text, **kw}


@pytest.fixture(scope="module")
def deployed(ray_cluster: Any, redis_server: RedisServer) -> Any:  # noqa: F811
    import ray

    from stickless.ray import deploy, undeploy

    namespace = f"ray{uuid.uuid4().hex[:6]}"
    handles = deploy(redis_server.url, "tests.ray_agent:make_opener", namespace, **TIMINGS)
    yield namespace, handles
    undeploy(namespace, grace=1.0)
    del ray


def test_one_router_per_node_and_forwarding(deployed: Any) -> None:
    import ray

    from stickless.ray import routers

    namespace, handles = deployed
    assert len(handles) == 3 == len(routers(namespace))
    nodes = list(handles.values())
    pings = ray.get([h.ping.remote() for h in nodes])
    assert {p["ray_node_id"] for p in pings} == set(handles)
    assert all(p["node_id"].startswith(p["ray_node_id"] + "/") for p in pings)
    first = ray.get(nodes[0].run.remote(request("s1", "hello")))
    ticket = ray.get(nodes[1].submit.remote(request("s1", "again")))
    result = ray.get(nodes[1].result.remote(ticket.turn_id))
    assert ticket.kind == "FORWARDED"
    assert result.executed_by == first.executed_by == pings[0]["node_id"]


def test_lookups_and_streams_work_on_every_router(deployed: Any) -> None:
    import ray

    _, handles = deployed
    nodes = list(handles.values())
    # Given a turn submitted on the first router
    ticket = ray.get(nodes[0].submit.remote(request("s3", "look up")))
    # When the other routers look it up by session and turn id, and stream a new turn
    result = ray.get(nodes[2].result.remote(ticket.turn_id, session_id="s3"))
    info = ray.get(nodes[1].turn.remote("s3", ticket.turn_id))
    entries = ray.get(nodes[1].transcript.remote("s3"))
    items = [ray.get(ref) for ref in nodes[2].stream.remote(request("s3", "one two"))]
    # Then they get its result, state and transcript, and the stream is its ticket, then
    # that turn's frames ending with one terminal frame
    assert (result.text, info.state, info.result) == ("echo:look up", TurnState.COMPLETED, result)
    assert [e.content for e in entries] == ["look up"]
    streamed, frames = items[0], items[1:]
    assert (streamed.origin, streamed.session_id) == ("new", "s3")
    assert {f.turn_id for f in frames} == {streamed.turn_id}
    assert [is_terminal(f) for f in frames].count(True) == 1 and is_terminal(frames[-1])


def _ray_samples(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample on a Ray node's metrics endpoint (Prometheus text), by name and labels."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _router_sample(port: int, name: str, node_id: str, **labels: str) -> float:
    """One router's sample (by its node id tag) on its Ray node's metrics endpoint."""
    wanted = {("node_id", node_id), *labels.items()}
    return sum(v for (n, tags), v in _ray_samples(port).items() if n == name and wanted <= tags)


def test_router_metrics_show_on_rays_metrics_endpoint(deployed: Any) -> None:
    import ray

    _, handles = deployed
    ray_node_id, router = next(iter(handles.items()))
    node_id = ray.get(router.ping.remote())["node_id"]
    (port,) = (n["MetricsExportPort"] for n in ray.nodes() if n["NodeID"] == ray_node_id)
    # When three turns of a session run on one router, which then releases the session
    for n in range(3):
        assert ray.get(router.run.remote(request("s-metrics", f"turn {n}"))).executed_by == node_id
    ray.get(router.release_session.remote("s-metrics"))
    # Then its Ray node's metrics endpoint shows that release (the router's first) and the
    # turns, tagged with the router's node id (Ray exports what its actors recorded every few
    # seconds: polled, bounded; the release was recorded after the turns, so they are in by then)
    wait_for(
        lambda: (
            _router_sample(port, "ray_stickless_evictions_total", node_id, reason="RELEASE") > 0
        ),
        timeout=60,
        what="the release on Ray's metrics endpoint",
        interval=0.5,
    )
    assert _router_sample(port, "ray_stickless_evictions_total", node_id, reason="RELEASE") == 1
    turns = _router_sample(port, "ray_stickless_turns_total", node_id, result="completed")
    assert turns >= 3  # (with the turns earlier tests ran on this router)


def test_killing_the_holder_router_answers_holder_lost_fast(deployed: Any) -> None:
    import ray

    from stickless.ray import routers

    namespace, _ = deployed
    nodes = list(routers(namespace).values())
    holder, caller = nodes[0], nodes[1]
    ray.get(holder.run.remote(request("s2", "warm")))
    ticket = ray.get(caller.submit.remote(request("s2", "gate:forever")))
    # Kill the holder only once the turn runs there (else a survivor would simply run it)
    while ray.get(holder.status.remote("s2")).active_turn_id != ticket.turn_id:
        pass
    ray.kill(holder)

    async def answer() -> BaseException | None:
        try:
            await caller.result.remote(ticket.turn_id)
        except TurnFailedError as exc:
            return exc
        return None

    error = asyncio.run(asyncio.wait_for(answer(), 30))
    assert isinstance(error, TurnFailedError)
    assert error.code is FailureCode.HOLDER_LOST


def test_the_local_cluster_leaves_the_machines_ray_pointer_alone(ray_cluster: Any) -> None:  # noqa: F811
    # Ray's "current cluster" pointer names this cluster only in the cluster's own directory;
    # the machine-wide one (where `ray start` and a bare `ray.init()` look) never does.
    import os
    from pathlib import Path

    own = Path(os.environ["RAY_TMPDIR"], "ray", "ray_current_cluster")
    assert ray_cluster.address in own.read_text()
    machine = Path("/tmp/ray/ray_current_cluster")
    assert not machine.exists() or ray_cluster.address not in machine.read_text()


def test_events_report_a_gap_where_the_log_lost_frames(
    ray_cluster: Any,  # noqa: F811
    redis_server: RedisServer,
) -> None:
    import ray
    import redis

    from stickless import StreamGap
    from stickless.backends.redis._keys import Keys
    from stickless.ray._actor import NodeRouter

    namespace = f"gap{uuid.uuid4().hex[:6]}"
    with FaultProxy("127.0.0.1", redis_server.port, password=redis_server.password) as proxy:
        # Given a router reaching Redis through the fault proxy, and its `events` stream of a
        # session that yielded a first turn's frames
        router = (
            ray.remote(NodeRouter)
            .options(num_cpus=0)
            .remote(proxy.url(), "tests.ray_agent:make_opener", namespace, TIMINGS, False)
        )
        try:
            ray.get(router.run.remote(request("g1", "one")), timeout=60)
            items = router.events.remote("g1", after="0-0")
            first = [ray.get(next(items), timeout=30) for _ in range(3)]
            assert [f.type for f in first][-1] == "turn_completed"
            # When its pub/sub is cut off while a second turn runs, the log drops all but that
            # turn's last frame (XDEL: its oldest id stays the first turn's), and the pub/sub
            # comes back
            refused = proxy.cut_before(command="SUBSCRIBE", times=None)
            assert proxy.reset_connections(subscribed=True) == 1
            refused.wait()
            ray.get(router.run.remote(request("g1", "two")), timeout=60)
            store = redis.Redis.from_url(redis_server.url)
            log_key = Keys(namespace).event_log("g1")
            *dropped, kept = [entry_id for entry_id, _ in store.xrange(log_key)][3:]
            store.xdel(log_key, *dropped)
            refused.cancel()
            # Then the stream says where its gap lies, then goes on with what the log holds
            gap, last = ray.get(next(items), timeout=30), ray.get(next(items), timeout=30)
            assert gap == StreamGap(first[-1].event_id, first[0].event_id)
            assert (last.type, last.event_id) == ("turn_completed", kept.decode())
        finally:
            ray.get(router.aclose.remote(1.0), timeout=30)
            ray.kill(router)
