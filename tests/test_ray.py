"""The Ray deployment on a local 3-node cluster: one router per node, handles, fast failover."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from stickless import FailureCode, TurnFailedError, TurnState, is_terminal

from .ray_cluster import ray_cluster  # noqa: F401  (fixture)
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
