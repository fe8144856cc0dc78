"""`router.follow`: a submitted turn's frames on any node, from its first (or past a cursor)
to its terminal frame, live while it runs; over memory and Redis."""

from __future__ import annotations

import asyncio

import pytest

from stickless import Event, InvalidRequestError, TurnCompleted, TurnStream, UnknownTurnError
from stickless.testing import LocalCluster

from .agents import Journal, req
from .conftest import ClusterFactory


async def _drain(stream: TurnStream) -> list[Event]:
    async with stream:
        return [frame async for frame in stream]


async def test_follow_streams_a_running_turn_from_another_node(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a turn running on A, its first frames already emitted
    journal.gate("one two")
    running = await a.submit(req("s1", "one two"))
    await journal.entered["one two"].wait()
    # When B follows it and the turn then ends
    reading = asyncio.ensure_future(_drain(await b.follow("s1", running.turn_id)))
    journal.gates["one two"].set()
    frames = await reading
    # Then B got the whole turn once, ending with its completion
    assert [f.type for f in frames] == ["turn_started", "text_delta", "text_delta",
                                        "turn_completed"]
    assert {f.turn_id for f in frames} == {running.turn_id}
    assert isinstance(frames[-1], TurnCompleted)
    assert frames[-1].text == (await running.result).text


async def test_follow_past_a_cursor_sends_only_the_later_frames(
    backend_cluster: LocalCluster,
) -> None:
    a, b, _ = backend_cluster.nodes
    done = await a.submit(req("s1", "x y z"))
    await done.result
    whole = await _drain(await b.follow("s1", done.turn_id))
    cursor = whole[1].event_id
    rest = await _drain(await b.follow("s1", done.turn_id, after=cursor))
    assert [f.event_id for f in rest] == [f.event_id for f in whole[2:]]


async def test_follow_refuses_an_unknown_turn_and_a_malformed_cursor(
    backend_cluster: LocalCluster,
) -> None:
    a = backend_cluster.nodes[0]
    with pytest.raises(UnknownTurnError):
        await a.follow("s1", "nope")
    done = await a.submit(req("s1", "x"))
    await done.result
    with pytest.raises(InvalidRequestError, match="after"):
        await a.follow("s1", done.turn_id, after="garbage")


async def test_a_reader_that_lagged_past_its_queue_gets_every_frame_from_the_log(
    cluster_over: ClusterFactory,
) -> None:
    async with cluster_over(nodes=2, subscriber_queue_size=4) as cluster:
        a, b = cluster.nodes
        words = [f"w{i}" for i in range(40)]
        # Given subscribers on both nodes that read nothing while a turn emits 40 words
        streams = [node.events("s1") for node in (a, b)]
        for stream in streams:
            await stream.ready()
        done = await a.submit(req("s1", " ".join(words)))
        await done.result
        for stream in streams:
            # When they read on, past the frames their queues of 4 dropped
            frames: list[Event] = []
            async with stream:
                async for frame in stream:
                    frames.append(frame)
                    if frame.type == "turn_completed":
                        break
            # Then each got every frame once, in order, fetched back from the event log
            assert stream.dropped > 0
            texts = [f.text.strip() for f in frames if f.type == "text_delta"]  # type: ignore[union-attr]
            assert texts == words
            assert [f.seq for f in frames] == sorted(f.seq for f in frames)
