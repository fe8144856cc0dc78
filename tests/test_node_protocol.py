"""The loopback node protocol: a node's service over TCP, errors and streams included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from stickless import (
    FailureCode,
    IdempotencyConflictError,
    InvalidRequestError,
    RouterClosedError,
    TurnFailedError,
    TurnState,
    UnknownTurnError,
)
from stickless.node import NodeClient, NodeServer, NodeService, load_opener
from stickless.testing import LocalCluster

from .agents import Journal


@pytest.fixture
async def served(cluster: LocalCluster) -> AsyncIterator[tuple[NodeClient, NodeClient]]:
    """Clients of nodes A and B of the cluster, each through its own loopback server."""
    servers = [NodeServer(NodeService(node)) for node in cluster.nodes[:2]]
    ports = [await s.start() for s in servers]
    clients = [await NodeClient.connect(p) for p in ports]
    yield clients[0], clients[1]
    for client in clients:
        await client.aclose()
    for server in servers:
        await server.aclose()


def request(text: str, **kw: object) -> dict[str, object]:
    return {"session_id": "s1", "agent_ref": "bot", "input": text, **kw}


async def test_submit_ticket_then_result(
    served: tuple[NodeClient, NodeClient], cluster: LocalCluster
) -> None:
    a, b = served
    first = await a.run(request("hello"))
    # A forwarded submit returns a small ticket; its result is fetched by turn id
    ticket = await b.submit(request("again"))
    result = await b.result(ticket["turn_id"])
    assert ticket["kind"] == "FORWARDED"
    assert ticket["node_id"] == cluster.nodes[1].node_id
    assert result.text == "echo:again"
    assert result.executed_by == first.executed_by == cluster.nodes[0].node_id


async def test_errors_cross_the_connection_with_their_type_and_code(
    served: tuple[NodeClient, NodeClient], journal: Journal
) -> None:
    a, b = served
    with pytest.raises(InvalidRequestError, match="session_id"):
        await a.submit({"session_id": "", "agent_ref": "bot", "input": "x"})
    await a.run(request("x", idempotency_key="k"))
    with pytest.raises(IdempotencyConflictError):
        await b.submit(request("y", idempotency_key="k"))
    with pytest.raises(InvalidRequestError, match="turn_id"):
        await a.result("never-submitted")
    # A failed turn raises TurnFailedError with its code on the remote side too
    journal.gate("long")
    ticket = await a.submit(request("long"))
    await journal.entered["long"].wait()
    await b.interrupt("s1", reason="USER", turn_id=ticket["turn_id"])
    with pytest.raises(TurnFailedError) as failure:
        await a.result(ticket["turn_id"])
    assert failure.value.code is FailureCode.INTERRUPTED


async def test_event_stream_over_the_connection(served: tuple[NodeClient, NodeClient]) -> None:
    a, b = served
    stream = await b.events("s1")
    await stream.ready()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traced = {**request("one two"), "trace": f"00-{trace_id}-00f067aa0ba902b7-01"}
    ticket = await a.submit(traced)
    seen = []
    async for event in stream:
        seen.append(event)
        if event.type == "turn_completed":
            break
    await stream.aclose()
    assert [e.type for e in seen] == ["turn_started", "text_delta", "text_delta", "turn_completed"]
    assert {e.turn_id for e in seen} == {ticket["turn_id"]}
    # The caller's trace crossed the connection: the ticket and every frame name it
    assert ticket["trace_id"] == trace_id and {e.trace_id for e in seen} == {trace_id}
    status = await b.status("s1")
    assert status["holder"] is not None


async def test_turn_lookups_cross_the_connection_on_any_node(
    served: tuple[NodeClient, NodeClient], journal: Journal, cluster: LocalCluster
) -> None:
    a, b = served
    # Given a turn submitted through A, held mid-run
    journal.gate("held")
    ticket = await a.submit(request("held"))
    await journal.entered["held"].wait()
    # When B looks it up by session and turn id
    running = await b.turn("s1", ticket["turn_id"])
    with pytest.raises(TimeoutError):
        await b.result(ticket["turn_id"], session_id="s1", timeout=0.05)
    waiting = asyncio.ensure_future(b.result(ticket["turn_id"], session_id="s1"))
    journal.gates["held"].set()
    result = await waiting
    # Then it sees the turn run and gets its result, though A took the submit
    assert (running.state, running.executed_by) == (TurnState.RUNNING, cluster.nodes[0].node_id)
    assert (result.text, result.turn_id) == ("echo:held", ticket["turn_id"])
    assert (await b.turn("s1", ticket["turn_id"])).state is TurnState.COMPLETED
    assert [e.content for e in await b.transcript("s1")] == ["held", "echo:held"]
    with pytest.raises(UnknownTurnError):
        await b.result("no-such-turn", session_id="s1")


async def test_a_streamed_submit_carries_its_ticket_then_the_turn(
    served: tuple[NodeClient, NodeClient],
) -> None:
    a, b = served
    await a.run(request("warm up", idempotency_key="k"))
    # When B streams a new request, then the same key again (cached)
    fresh = await b.stream(request("one two"))
    fresh_frames = [e async for e in fresh]
    cached = await b.stream(request("warm up", idempotency_key="k"))
    cached_frames = [e async for e in cached]
    # Then each stream names its origin and turn, and ends with the turn's completion
    assert fresh.ticket is not None and cached.ticket is not None
    assert (fresh.ticket["origin"], cached.ticket["origin"]) == ("new", "cached")
    assert [e.type for e in fresh_frames] == [
        "turn_started",
        "text_delta",
        "text_delta",
        "turn_completed",
    ]
    assert {e.turn_id for e in fresh_frames} == {fresh.ticket["turn_id"]}
    assert [e.type for e in cached_frames][-1] == "turn_completed"
    # And a refused stream raises the submit's error
    with pytest.raises(IdempotencyConflictError):
        await b.stream(request("other", idempotency_key="k"))


async def test_lost_connection_fails_pending_calls(
    served: tuple[NodeClient, NodeClient], journal: Journal
) -> None:
    a, _ = served
    journal.gate("stuck")
    ticket = await a.submit(request("stuck"))
    pending = asyncio.ensure_future(a.result(ticket["turn_id"]))
    await journal.entered["stuck"].wait()
    await a.aclose()
    with pytest.raises(RouterClosedError):
        await pending


def test_load_opener_accepts_an_opener_or_a_factory() -> None:
    with pytest.raises(ValueError, match=r"package\.module:attribute"):
        load_opener("no-colon")
    made = load_opener("tests.node_openers:make_opener")
    assert hasattr(made, "open")
    direct = load_opener("tests.node_openers:OPENER")
    assert hasattr(direct, "open")
    with pytest.raises(ValueError, match="neither"):
        load_opener("tests.node_openers:NOT_AN_OPENER")


def test_an_error_subclass_travels_as_the_error_the_other_side_knows() -> None:
    from stickless import BackendUnavailableError
    from stickless.backends.base import NotLive
    from stickless.node._service import error_from_wire, error_to_wire

    # When a refusal the client has no class for crosses the connection
    wire = error_to_wire(NotLive("node-1 has no live incarnation"))
    # Then it arrives as its nearest known base, so callers retry it like any outage
    assert wire == {"type": "BackendUnavailableError", "message": "node-1 has no live incarnation"}
    assert isinstance(error_from_wire(wire), BackendUnavailableError)
