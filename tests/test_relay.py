"""The relay's overflow policy and subscriber back-pressure (narrow units, no backend needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from stickless import (
    Event,
    Interrupted,
    ReasoningDelta,
    TextDelta,
    ToolUseStarted,
    TurnCompleted,
)
from stickless.actors import EventRelay, Queued, RankedQueue
from stickless.router._subscribers import Subscriber


def kinds(queued: Sequence[Queued]) -> list[str]:
    return [q.frame.type for q in queued]


def test_overflow_sheds_reasoning_before_text_before_structure() -> None:
    # Given a full queue holding one frame of each rank
    queue = RankedQueue(capacity=3)
    queue.push(ToolUseStarted(tool_use_id="t", name="search"))
    queue.push(TextDelta(text="a"))
    queue.push(ReasoningDelta(text="hmm"))
    # When a text frame arrives, the oldest frame of the lowest rank <= text goes: reasoning
    queue.push(TextDelta(text="b"))
    assert kinds(queue.take_all()) == ["tool_use_started", "text_delta", "text_delta"]
    assert queue.dropped == 1


def test_reasoning_never_pushes_out_text() -> None:
    queue = RankedQueue(capacity=2)
    queue.push(TextDelta(text="a"))
    queue.push(TextDelta(text="b"))
    # A reasoning frame finds nothing of its rank to shed: the incoming frame is dropped
    queue.push(ReasoningDelta(text="x"))
    assert [q.frame.text for q in queue.take_all()] == ["a", "b"]  # type: ignore[union-attr]
    assert queue.dropped == 1


def test_structural_frame_sheds_text_and_terminal_is_always_kept() -> None:
    queue = RankedQueue(capacity=2)
    queue.push(TextDelta(text="a"))
    queue.push(ToolUseStarted(tool_use_id="t", name="n"))
    queue.push(TurnCompleted(text="done"))  # sheds the text delta
    assert kinds(queue.take_all()) == ["tool_use_started", "turn_completed"]
    # With only structural frames buffered, a terminal frame still gets in (oldest structural
    # non-terminal frame is shed first)
    queue.push(ToolUseStarted(tool_use_id="1", name="n"))
    queue.push(ToolUseStarted(tool_use_id="2", name="n"))
    queue.push(Interrupted(reason="USER"))
    assert kinds(queue.take_all()) == ["tool_use_started", "interrupted"]


def test_slow_local_subscriber_drops_its_oldest_frames() -> None:
    sub = Subscriber("s1", None, capacity=2)
    for i in range(5):
        sub.offer(TextDelta(session_id="s1", turn_id="t", seq=i, text=str(i)))
    assert [f.seq for f in sub.frames] == [3, 4]
    assert sub.dropped == 3


async def test_relay_stamps_frames_and_never_blocks_the_producer() -> None:
    delivered: list[Event] = []
    release = asyncio.Event()

    async def slow_sink(session_id: str, frames: Sequence[Event]) -> None:
        await release.wait()
        delivered.extend(frames)

    relay = EventRelay("s1", "turn-1", slow_sink, capacity=4)
    # When the producer emits far more frames than the queue holds while the sink is stuck
    for i in range(100):
        relay.emit(TextDelta(text=str(i)))  # returns at once every time
    release.set()
    relay.emit(TurnCompleted(text="end"))
    await relay.flushed(flush_timeout=5)
    # Then frames were stamped, shed by rank (counted), and the terminal frame arrived last
    assert {(f.session_id, f.turn_id) for f in delivered} == {("s1", "turn-1")}
    assert delivered[-1].type == "turn_completed"
    seqs = [f.seq for f in delivered]
    assert seqs == sorted(seqs)
    assert relay.dropped == 100 + 1 - len(delivered)
    assert relay.dropped > 0
    # Frames emitted after the terminal one are refused and counted
    relay.emit(TextDelta(text="late"))
    assert relay.dropped == 100 + 2 - len(delivered)


async def test_relay_drops_are_reported_to_metrics() -> None:
    from stickless import SessionRouter, TurnOutput
    from stickless._config import RouterConfig
    from stickless.testing import CountingMetrics

    class Chatty:
        async def run_turn(self, turn):  # type: ignore[no-untyped-def]
            for i in range(500):
                turn.emit(ReasoningDelta(text=str(i)))  # far more than the queue holds
            return TurnOutput(text="done")

        async def interrupt(self, reason: str) -> None:
            return None

        async def aclose(self) -> None:
            return None

    metrics = CountingMetrics()
    router = SessionRouter.build(
        config=RouterConfig(relay_queue_size=8),
        session_factory=lambda s, a: Chatty(),
        metrics=metrics,
    )
    await router.start()
    try:
        disp = await router.submit({"session_id": "s1", "agent_ref": "bot", "input": "go"})
        assert (await disp.result).text == "done"
    finally:
        await router.aclose()
    dropped = [args for hook, args in metrics.calls if hook == "on_events_dropped"]
    assert len(dropped) == 1 and dropped[0][0] == "s1" and dropped[0][1] > 0
    assert dropped[0][2] == "reasoning"  # only reasoning frames were emitted, so only they shed
