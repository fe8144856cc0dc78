"""HotPath contract, a finish with the turn's last frames: recorded, it logs and publishes them
as one relay batch (their ids in the answer) in the same step; run again, it answers the same
ids and logs nothing twice; refused, it logs and publishes nothing."""

from __future__ import annotations

from stickless._events import Event, TextDelta, TurnCompleted
from stickless.backends.base import Backends, TurnFrames
from stickless.wire import Outcome, SignalKind

from .test_event_relay import Recorder, _signal_frames
from .test_idempotency import DAY, _ok, _reserve


def _tail() -> TurnFrames:
    frames: tuple[Event, ...] = (
        TextDelta(session_id="s1", turn_id="t1", seq=4, text="last words"),
        TurnCompleted(session_id="s1", turn_id="t1", seq=5, text="done"),
    )
    return TurnFrames("tail-1", frames)


async def test_a_finish_logs_and_publishes_the_last_frames_as_one_batch(
    backends: Backends,
) -> None:
    # Given node-a's reservation and a subscriber on s1's event channel
    await _reserve(backends)
    events = Recorder()
    await backends.signals.subscribe_events("s1", events)
    # When node-a finishes the turn with its last frames
    finished = await backends.hotpath.finish("s1", "k1", "node-a", _ok(), DAY, frames=_tail())
    # Then the frames are logged under the ids the finish answered...
    assert finished.recorded
    logged = await backends.events.read("s1", None, 100)
    assert [e.event_id for e in logged] == list(finished.event_ids)
    assert [e.model_copy(update={"event_id": None}) for e in logged] == list(_tail().frames)
    # ...and went out as one EVENT signal from node-a, ids included
    signal = await events.next()
    assert (signal.kind, signal.origin) == (SignalKind.EVENT, "node-a")
    assert _signal_frames(signal) == logged


async def test_a_finish_run_again_answers_the_same_frame_ids(backends: Backends) -> None:
    # Given a finish with frames that ran (its reply lost)
    await _reserve(backends)
    first = await backends.hotpath.finish("s1", "k1", "node-a", _ok(), DAY, frames=_tail())
    # When the very same call is sent again
    again = await backends.hotpath.finish("s1", "k1", "node-a", _ok(), DAY, frames=_tail())
    # Then it answers the same ids and the frames are logged once
    assert again.recorded and again.event_ids == first.event_ids
    assert len(first.event_ids) == 2
    assert len(await backends.events.read("s1", None, 100)) == 2


async def test_a_refused_finish_logs_no_frames(backends: Backends) -> None:
    # Given a turn another node already answered (a holder-loss reset)
    await _reserve(backends)
    lost = Outcome(turn_id="t1", ok=False, code="HOLDER_LOST", message="gone")
    assert await backends.idempotency.compare_and_reset("s1", "k1", "node-a", lost)
    # When node-a finishes it with its last frames
    finished = await backends.hotpath.finish("s1", "k1", "node-a", _ok(), DAY, frames=_tail())
    # Then it is refused and nothing is logged (the decider sent the turn's terminal frame)
    assert not finished.recorded and finished.event_ids == ()
    assert await backends.events.read("s1", None, 100) == []
