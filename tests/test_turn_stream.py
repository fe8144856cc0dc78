"""`router.stream`: a submitted turn's frames from its first to exactly one terminal frame,
for a new turn, one attached to while it runs, and a cached answer, over memory and Redis."""

from __future__ import annotations

import asyncio

import pytest

from stickless import (
    Event,
    FailureCode,
    SubmitOrigin,
    TurnCompleted,
    TurnFailed,
    TurnStream,
    is_terminal,
)
from stickless._events import LATE_TERMINAL_SEQ
from stickless.testing import LocalCluster

from .agents import Journal, req, stall_take_overs
from .conftest import ClusterFactory


async def _drain(stream: TurnStream) -> list[Event]:
    async with stream:
        return [frame async for frame in stream]


def _shape(frames: list[Event]) -> list[str]:
    return [frame.type for frame in frames]


def _one_terminal_last(frames: list[Event], turn_id: str) -> None:
    assert {frame.turn_id for frame in frames} == {turn_id}
    assert [is_terminal(frame) for frame in frames].count(True) == 1
    assert is_terminal(frames[-1])


async def test_a_new_turn_streams_from_its_start_to_its_end(
    backend_cluster: LocalCluster,
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a session held by A
    await (await a.submit(req("s1", "warm up"))).result
    # When B streams a new turn of it (forwarded to A)
    stream = await b.stream(req("s1", "one two"))
    frames = await _drain(stream)
    # Then the stream is the new turn's, from turn_started to its completion
    assert stream.origin is SubmitOrigin.NEW
    assert _shape(frames) == ["turn_started", "text_delta", "text_delta", "turn_completed"]
    _one_terminal_last(frames, stream.disposition.turn_id)
    assert isinstance(frames[-1], TurnCompleted) and frames[-1].text == "echo:one two"


async def test_an_attached_stream_replays_the_running_turn_from_its_start(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a turn with a key running on A, its first frames already emitted
    journal.gate("alpha beta")
    first = await a.submit(req("s1", "alpha beta", idempotency_key="k"))
    await journal.entered["alpha beta"].wait()
    # When B streams the same request (same key) while it runs, and the turn then ends
    stream = await b.stream(req("s1", "alpha beta", idempotency_key="k"))
    assert stream.origin is SubmitOrigin.ATTACHED
    assert stream.disposition.turn_id == first.turn_id
    reading = asyncio.ensure_future(_drain(stream))
    journal.gates["alpha beta"].set()
    frames = await reading
    # Then it got the whole turn once: the frames before the attach, then the completion
    assert _shape(frames) == ["turn_started", "text_delta", "text_delta", "turn_completed"]
    _one_terminal_last(frames, first.turn_id)
    assert journal.texts("s1") == ["alpha beta"]


async def test_a_cached_stream_replays_the_stored_turn_or_makes_its_completion(
    backend_cluster: LocalCluster,
) -> None:
    a, b, c = backend_cluster.nodes
    # Given a finished turn with a key
    done = await a.submit(req("s1", "x y", idempotency_key="k"))
    result = await done.result
    # When the same request is streamed again on another node
    stream = await b.stream(req("s1", "x y", idempotency_key="k"))
    frames = await _drain(stream)
    # Then the stored turn's frames come back, ending with its completion once
    assert stream.origin is SubmitOrigin.CACHED
    assert _shape(frames) == ["turn_started", "text_delta", "text_delta", "turn_completed"]
    _one_terminal_last(frames, done.turn_id)
    # When the event log no longer holds the turn and the request is streamed once more
    await backend_cluster.backends.events.delete("s1")
    again = await _drain(await c.stream(req("s1", "x y", idempotency_key="k")))
    # Then a completion is made from the stored answer
    assert _shape(again) == ["turn_completed"]
    made = again[0]
    assert isinstance(made, TurnCompleted)
    assert (made.turn_id, made.text, made.executed_by) == (
        done.turn_id,
        result.text,
        result.executed_by,
    )


async def test_a_stream_of_a_turn_evicted_before_it_ran_ends_with_its_failure(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a turn running on A and B's streamed turn queued behind it
    journal.gate("held")
    await a.submit(req("s1", "held"))
    await journal.entered["held"].wait()
    stream = await b.stream(req("s1", "queued"))
    reading = asyncio.ensure_future(_drain(stream))
    # When the session is released (the queued turn is answered EVICTED without running)
    await a.release_session("s1")
    frames = await reading
    # Then the stream ends with one terminal frame carrying EVICTED
    _one_terminal_last(frames, stream.disposition.turn_id)
    last = frames[-1]
    assert isinstance(last, TurnFailed) and last.code is FailureCode.EVICTED
    assert "queued" not in journal.texts("s1")


async def test_a_stream_of_a_turn_its_forward_deadline_answered_ends_with_that_failure(
    cluster_over: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_over(nodes=2, forward_ttl=1.5) as cluster:
        a, b = cluster.nodes
        # Given a session held by A, whose take-overs hang (a forwarded turn never starts)
        await (await a.submit(req("s1", "warm up"))).result
        stuck = stall_take_overs(a, monkeypatch)
        # When B streams a turn, which its forward deadline answers FORWARD_TIMEOUT
        stream = await b.stream(req("s1", "lost"))
        await stuck.wait()
        frames = await _drain(stream)
        # Then the stream ends with one terminal frame carrying that answer
        assert stream.origin is SubmitOrigin.NEW
        _one_terminal_last(frames, stream.disposition.turn_id)
        last = frames[-1]
        assert isinstance(last, TurnFailed) and last.code is FailureCode.FORWARD_TIMEOUT


async def test_a_stream_whose_answer_comes_without_a_terminal_frame_ends_with_one_made_from_it(
    cluster_over: ClusterFactory, journal: Journal
) -> None:
    async with cluster_over(nodes=2, forward_ttl=1.5) as cluster:
        a, b = cluster.nodes
        # Given a session held by A, and B's streamed turn running there past B's forward
        # deadline (B's caller is answered FORWARD_TIMEOUT; no frame says so: the turn runs on)
        await (await a.submit(req("s1", "warm up"))).result
        journal.gate("long")
        stream = await b.stream(req("s1", "long"))
        frames = await _drain(stream)
        journal.gates["long"].set()
        # Then the stream has the turn's frames, then one terminal frame made from the answer
        assert _shape(frames) == ["turn_started", "text_delta", "turn_failed"]
        _one_terminal_last(frames, stream.disposition.turn_id)
        last = frames[-1]
        assert isinstance(last, TurnFailed) and last.code is FailureCode.FORWARD_TIMEOUT
        assert last.seq == LATE_TERMINAL_SEQ
