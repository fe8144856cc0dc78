"""Byte bounds of relay batches and frames: the pure splitting decisions (table tests), the
relay cutting an oversized delta and refusing any other oversized frame at `emit`, and the
turn's finish batch kept within the bound (no backend needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from stickless import (
    Event,
    FrameTooLargeError,
    Priority,
    ReasoningDelta,
    RouterConfig,
    SessionRouter,
    TextDelta,
    ToolUseStarted,
    TurnCompleted,
    TurnContext,
    TurnFailedError,
    TurnOutput,
    UserInput,
)
from stickless._types import MAX_ID_LENGTH, MAX_MESSAGE_CHARS
from stickless.actors import EventRelay, Queued
from stickless.actors._ending import retrying_frame
from stickless.actors._sizes import FrameSizes, frame_limit, split_runs, split_text
from stickless.actors._work import TurnWork
from stickless.wire import (
    EVENT_BATCH_ENVELOPE_BYTES,
    MAX_EVENT_ID_BYTES,
    encode_event,
    event_batch_parts,
    pack,
    pack_event_batch,
)

#: The smallest bound a deployment may set: the tests' batches are checked against it.
BOUND = 256 * 1024
#: The largest event id a store gives, as a batch's signal carries it.
LONGEST_ID = f"{2**64 - 1}-{2**64 - 1}"
#: The longest node id (an origin), for the batches' signals.
ORIGIN = "n" * 200


@pytest.mark.parametrize(
    ("text", "max_bytes", "pieces"),
    [
        ("", 4, [""]),
        ("abcd", 4, ["abcd"]),
        ("abcdefghij", 4, ["abcd", "efgh", "ij"]),
        ("aé" * 3, 4, ["aéa", "éa", "é"]),  # é is 2 bytes: a cut never falls inside it
        ("ab€cd", 4, ["ab", "€c", "d"]),  # € is 3 bytes
        ("a😀b", 4, ["a", "😀", "b"]),  # 😀 is 4 bytes, alone in its piece
        ("😀😀", 7, ["😀", "😀"]),
        ("😀😀", 8, ["😀😀"]),
        ("x€" * 4, 5, ["x€x", "€x", "€x", "€"]),
    ],
)
def test_split_text_cuts_between_characters(text: str, max_bytes: int, pieces: list[str]) -> None:
    assert split_text(text, max_bytes) == pieces
    assert "".join(pieces) == text
    assert all(len(piece.encode()) <= max_bytes for piece in pieces)


def test_split_text_needs_room_for_any_character() -> None:
    with pytest.raises(ValueError, match="max_bytes must be at least 4"):
        split_text("abc", 3)


@pytest.mark.parametrize(
    ("costs", "budget", "runs"),
    [
        ([], 10, []),
        ([2, 2, 2], 6, [3]),
        ([3, 3, 3], 6, [2, 1]),
        ([6, 6], 6, [1, 1]),
        ([7], 6, [1]),  # over the budget alone: a run of one
        ([1, 7, 1], 6, [1, 1, 1]),
        ([5, 1, 1, 5], 6, [2, 2]),
        ([5, 2, 1, 5], 6, [1, 2, 1]),
    ],
)
def test_split_runs_keeps_order_and_budget(costs: list[int], budget: int, runs: list[int]) -> None:
    assert split_runs(costs, budget) == runs
    assert sum(runs) == len(costs)


@pytest.mark.parametrize(
    "frame",
    [
        TextDelta(session_id="s1", turn_id="t1", seq=1, text=""),
        TextDelta(session_id="s1", turn_id="t1", seq=1, text="plain ascii"),
        TextDelta(session_id="s1", turn_id="t1", seq=2**40, text="x" * 70_000),
        ReasoningDelta(session_id="s1", turn_id="t1", seq=300, text="ab€é😀" * 1000),
        TextDelta(
            session_id="s1", turn_id="t1", seq=1, text="é", trace_id="a" * 32, span_id="b" * 16
        ),
        ToolUseStarted(session_id="s1", turn_id="t1", tool_use_id="u", name="n"),
    ],
)
def test_frame_sizes_bound_the_encoded_size_tightly(frame: Event) -> None:
    sizes = FrameSizes()
    sizes.of(frame.model_copy(update={"seq": 7}))  # a delta's envelope, measured once
    exact = len(encode_event(frame))
    assert exact <= sizes.of(frame) <= exact + 12


def test_the_envelope_reserve_covers_the_longest_ids() -> None:
    # A session id of 200 four-byte characters, a node id of 200, the largest array headers
    head, middle = event_batch_parts("\U0010ffff" * MAX_ID_LENGTH, ORIGIN, 2**32 - 1)
    assert len(head) + len(middle) <= EVENT_BATCH_ENVELOPE_BYTES
    assert len(pack(LONGEST_ID)) == MAX_EVENT_ID_BYTES


def _signal_bytes(frames: Sequence[Event]) -> int:
    """The size of the EVENT signal of a batch of `frames` with the longest ids and origin."""
    encoded = [encode_event(frame) for frame in frames]
    return len(pack_event_batch("s1", ORIGIN, encoded, [LONGEST_ID] * len(frames)))


class Sink:
    """Collects the batches a relay hands over."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []

    async def __call__(self, session_id: str, frames: Sequence[Event]) -> None:
        self.batches.append(list(frames))

    @property
    def frames(self) -> list[Event]:
        return [frame for batch in self.batches for frame in batch]


def _relay(sink: Sink) -> EventRelay:
    return EventRelay("s1", "t1", sink, capacity=4096, max_batch_bytes=BOUND)


#: Mixed 1- to 4-byte characters, 880 KB encoded: over three times the bound.
MIXED = "ab€é😀" * 80_000


@pytest.mark.parametrize("kind", [TextDelta, ReasoningDelta])
async def test_an_oversized_delta_goes_out_as_several_in_bounded_batches(
    kind: type[TextDelta] | type[ReasoningDelta],
) -> None:
    sink = Sink()
    relay = _relay(sink)
    # When an agent emits a delta over three times the bound, a small one, then the turn ends
    relay.emit(kind(text=MIXED))
    relay.emit(kind(text="tail"))
    relay.emit(TurnCompleted(text="done"))
    await relay.flushed(flush_timeout=10)
    # Then it went out as several deltas of its kind, in order, whose texts join to it
    frames = sink.frames
    deltas = frames[:-1]
    assert len(deltas) == 5
    assert all(type(f) is kind for f in deltas)
    assert "".join(f.text for f in deltas) == MIXED + "tail"  # type: ignore[union-attr]
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    assert relay.dropped == 0
    # ...each frame within the frame bound, each batch's signal within the batch bound
    assert max(len(encode_event(f)) for f in frames) <= frame_limit(BOUND)
    assert max(_signal_bytes(batch) for batch in sink.batches) <= BOUND


async def test_an_oversized_frame_of_another_kind_is_refused_naming_the_bound() -> None:
    sink = Sink()
    relay = _relay(sink)
    big = ToolUseStarted(tool_use_id="u1", name="search", input_summary={"q": "x" * BOUND})
    # When an agent emits a tool frame over the bound, the emit raises, naming the bound
    with pytest.raises(FrameTooLargeError) as refused:
        relay.emit(big)
    message = str(refused.value)
    assert "tool_use_started" in message
    assert f"frame bound of {frame_limit(BOUND)} bytes" in message
    assert "max_relay_batch_bytes" in message
    # ...and nothing of it is sent: the turn's frames go on from seq 1
    relay.emit(TextDelta(text="after"))
    relay.emit(TurnCompleted(text="done"))
    await relay.flushed(flush_timeout=10)
    assert [(f.type, f.seq) for f in sink.frames] == [("text_delta", 1), ("turn_completed", 2)]


async def _sealed_with(sink: Sink, deltas: Sequence[str]) -> tuple[EventRelay, list[Queued]]:
    """A relay whose turn emitted `deltas` and was sealed before any batch went out."""
    relay = _relay(sink)
    for text in deltas:
        relay.emit(TextDelta(text=text))
    tail = await relay.seal()
    assert sink.batches == []
    return relay, tail


async def test_the_finish_batch_is_bounded_what_does_not_fit_going_out_first() -> None:
    sink = Sink()
    # Given a turn whose queued frames, over three times the bound, are left for its finish
    relay, tail = await _sealed_with(sink, [MIXED])
    # When its last frames are taken with its terminal frame
    last = await relay.last_frames(tail, relay.stamp(TurnCompleted(text="done")))
    # Then the finish's batch is within the bound and ends with the terminal frame, and what
    # did not fit went to the sink first, in bounded batches
    finish = list(last.frames.frames)
    assert finish[-1].type == "turn_completed"
    assert _signal_bytes(finish) <= BOUND
    assert sink.batches
    assert max(_signal_bytes(batch) for batch in sink.batches) <= BOUND
    frames = sink.frames + finish
    assert "".join(f.text for f in frames[:-1]) == MIXED  # type: ignore[union-attr]
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    last.logged()


async def test_a_replaced_terminal_frame_is_bounded_with_its_batch() -> None:
    sink = Sink()
    # Given a finish batch nearly full with a small terminal frame
    relay, tail = await _sealed_with(sink, ["x" * 100_000, "y" * 100_000])
    last = await relay.last_frames(tail, relay.stamp(TurnCompleted()))
    assert len(last.frames.frames) == 3 and sink.batches == []
    # When its terminal frame is replaced by a larger one (a fenced-out finish fails it)
    bigger = relay.stamp(TurnCompleted(text="z" * 100_000), seq=last.terminal.seq)
    replaced = await last.replaced(bigger)
    # Then the new batch is within the bound, the frames that no longer fit went out first
    assert _signal_bytes(replaced.frames.frames) <= BOUND
    assert [f.seq for f in sink.frames + list(replaced.frames.frames)] == [1, 2, 3]
    replaced.logged()


async def test_a_terminal_frame_over_the_bound_goes_alone() -> None:
    sink = Sink()
    relay, tail = await _sealed_with(sink, ["x" * 1000, "y" * 1000])
    # When the terminal frame carries an output over the bound (outputs go up to 8 MiB)
    last = await relay.last_frames(tail, relay.stamp(TurnCompleted(text="z" * (2 * BOUND))))
    # Then it is the finish's batch alone, every other frame sent first
    assert [f.seq for f in last.frames.frames] == [3]
    assert [f.seq for f in sink.frames] == [1, 2]
    last.logged()


def test_a_retrying_frame_carries_a_bounded_message() -> None:
    work = TurnWork("s1", "t1", "k", "bot", UserInput.text("go"), Priority.NEXT)
    frame = retrying_frame(work, RuntimeError("e" * (4 * MAX_MESSAGE_CHARS)), "n1")
    assert len(frame.message) == MAX_MESSAGE_CHARS
    assert frame.message.startswith("RuntimeError: eee")


@pytest.mark.parametrize("size", [BOUND - 1, 8 * 1024 * 1024 + 1])
def test_the_batch_bound_is_validated(size: int) -> None:
    with pytest.raises(ValueError, match="max_relay_batch_bytes"):
        RouterConfig(max_relay_batch_bytes=size)
    assert RouterConfig().max_relay_batch_bytes == 1024 * 1024


async def test_an_agent_emitting_an_oversized_frame_fails_its_turn_saying_why() -> None:
    class Oversized:
        async def run_turn(self, turn: TurnContext) -> TurnOutput:
            turn.emit(ToolUseStarted(tool_use_id="u1", name="n", input_summary={"q": "x" * BOUND}))
            return TurnOutput(text="unreachable")

        async def interrupt(self, reason: str) -> None:
            return None

        async def aclose(self) -> None:
            return None

    config = RouterConfig(max_relay_batch_bytes=BOUND)
    router = SessionRouter.build(config=config, session_factory=lambda s, a: Oversized())
    await router.start()
    try:
        disposition = await router.submit({"session_id": "s1", "agent_ref": "bot", "input": "go"})
        with pytest.raises(TurnFailedError) as failed:
            await asyncio.wait_for(disposition.result, 10)
    finally:
        await router.aclose()
    assert "FrameTooLargeError" in str(failed.value)
    assert f"frame bound of {frame_limit(BOUND)} bytes" in str(failed.value)
