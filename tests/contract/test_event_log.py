"""EventLog contract: bounded per-session frames with increasing ids usable as resume cursors."""

from __future__ import annotations

from stickless._events import Event, Interrupted, TextDelta, TurnCompleted, TurnStarted
from stickless.backends.base import Backends, event_id_key


def _frames(count: int, session_id: str = "s1", turn_id: str = "t1") -> list[Event]:
    return [
        TextDelta(session_id=session_id, turn_id=turn_id, seq=n, text=f"chunk {n}")
        for n in range(count)
    ]


def _without_ids(events: list[Event]) -> list[Event]:
    return [e.model_copy(update={"event_id": None}) for e in events]


async def test_append_returns_strictly_increasing_ids(backends: Backends) -> None:
    # Given an empty log
    # When frames are appended in three calls
    ids = await backends.events.append("s1", _frames(5))
    ids += await backends.events.append("s1", _frames(1))
    ids += await backends.events.append("s1", _frames(3))
    # Then every frame got an id, and ids strictly increase across calls
    keys = [event_id_key(i) for i in ids]
    assert len(ids) == 9
    assert keys == sorted(set(keys))


async def test_read_returns_frames_with_their_ids(backends: Backends) -> None:
    # Given a turn's frames of several types in the log
    frames: list[Event] = [
        TurnStarted(session_id="s1", turn_id="t1", seq=0, executed_by="node-a"),
        TextDelta(session_id="s1", turn_id="t1", seq=1, text="hi"),
        TurnCompleted(session_id="s1", turn_id="t1", seq=2, text="hi", data={"n": 1}),
    ]
    ids = await backends.events.append("s1", frames)
    # When the whole log is read
    read = await backends.events.read("s1", None, 100)
    # Then the frames come back in order, equal to what was appended, each carrying its id
    assert [e.event_id for e in read] == ids
    assert _without_ids(read) == frames


async def test_read_after_cursor_returns_only_later_frames(backends: Backends) -> None:
    # Given ten frames in the log
    frames = _frames(10)
    ids = await backends.events.append("s1", frames)
    # When a client resumes after the fourth frame
    read = await backends.events.read("s1", ids[3], 100)
    # Then it gets exactly the frames after it
    assert [e.event_id for e in read] == ids[4:]
    assert _without_ids(read) == frames[4:]
    assert await backends.events.read("s1", ids[-1], 100) == []


async def test_read_respects_limit(backends: Backends) -> None:
    # Given ten frames in the log
    ids = await backends.events.append("s1", _frames(10))
    # When reads are limited to three frames, paging with the cursor
    first = await backends.events.read("s1", None, 3)
    second = await backends.events.read("s1", first[-1].event_id, 3)
    # Then each page has three frames, contiguous
    assert [e.event_id for e in first + second] == ids[:6]


async def test_log_is_bounded_and_drops_oldest(backends: Backends, event_log_max_len: int) -> None:
    # Given more frames appended than the log keeps
    total = event_log_max_len * 3
    ids: list[str] = []
    for _ in range(total // 10):
        ids += await backends.events.append("s1", _frames(10))
    # When the whole log is read
    read = await backends.events.read("s1", None, total)
    # Then it holds at most the bound, the newest are kept, and the oldest were dropped
    kept = [e.event_id for e in read]
    assert 0 < len(kept) <= event_log_max_len
    assert kept == ids[-len(kept) :]
    assert ids[0] not in kept


async def test_sessions_have_separate_logs(backends: Backends) -> None:
    # Given frames in two sessions
    await backends.events.append("s1", _frames(2, "s1"))
    s2_ids = await backends.events.append("s2", [Interrupted(session_id="s2", reason="USER")])
    # When one session's log is read
    read = await backends.events.read("s2", None, 100)
    # Then only its frames come back
    assert [e.event_id for e in read] == s2_ids
    assert isinstance(read[0], Interrupted)


async def test_delete_empties_the_session_log(backends: Backends) -> None:
    # Given frames in two sessions
    old_ids = await backends.events.append("s1", _frames(3))
    await backends.events.append("s2", _frames(1, "s2"))
    # When s1's log is deleted
    await backends.events.delete("s1")
    # Then s1 reads empty, s2 is untouched, and a new frame in s1 is readable on its own
    assert await backends.events.read("s1", None, 100) == []
    assert len(await backends.events.read("s2", None, 100)) == 1
    new_ids = await backends.events.append("s1", _frames(1))
    assert [e.event_id for e in await backends.events.read("s1", None, 100)] == new_ids
    assert new_ids[0] not in old_ids


async def test_read_of_unknown_session_is_empty(backends: Backends) -> None:
    # Given a session that never logged anything
    # When its log is read
    read = await backends.events.read("nobody", None, 100)
    # Then nothing comes back
    assert read == []
