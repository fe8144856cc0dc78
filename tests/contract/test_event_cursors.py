"""EventLog contract: a resume cursor the log cannot serve is reported, never answered with a
silently empty or partial page.

A cursor equal to the last id is fine (nothing new yet). A cursor older than what the log still
holds, when events after it were dropped (trimmed by the bound, deleted with the session, or
expired with the whole log), raises `EventCursorTrimmedError`; one later than the newest id the
log ever gave raises `EventCursorAheadError`. A cursor exactly at the last dropped event loses
nothing and reads on.
"""

from __future__ import annotations

import pickle

import pytest

from stickless._errors import (
    EventCursorAheadError,
    EventCursorError,
    EventCursorTrimmedError,
    InvalidRequestError,
)
from stickless._events import Event, TextDelta
from stickless.backends.base import Backends, event_id_key


def _frames(count: int, session_id: str = "s1") -> list[Event]:
    return [
        TextDelta(session_id=session_id, turn_id="t1", seq=n, text=f"chunk {n}")
        for n in range(count)
    ]


async def _fill(backends: Backends, total: int, session_id: str = "s1") -> list[str]:
    ids: list[str] = []
    for start in range(0, total, 10):
        ids += await backends.events.append(session_id, _frames(min(10, total - start)))
    return ids


def _after(event_id: str, *, ms: int = 0, seq: int = 0) -> str:
    major, minor = event_id_key(event_id)
    return f"{major + ms}-{minor + seq}"


async def test_cursor_at_the_last_id_reads_empty_without_error(backends: Backends) -> None:
    # Given a log of five frames
    ids = await backends.events.append("s1", _frames(5))
    # When a client resumes from the newest id
    # Then there is nothing new yet, and that is no error
    assert await backends.events.read("s1", ids[-1], 100) == []


@pytest.mark.parametrize(("ms", "seq"), [(0, 1), (1, 0), (10**9, 0)])
async def test_cursor_from_the_future_is_ahead_of_the_log(
    backends: Backends, ms: int, seq: int
) -> None:
    # Given a log of five frames
    ids = await backends.events.append("s1", _frames(5))
    cursor = _after(ids[-1], ms=ms, seq=seq)
    # When a client resumes from an id the log never gave
    with pytest.raises(EventCursorAheadError) as raised:
        await backends.events.read("s1", cursor, 100)
    # Then the error names the log's last id and the cursor
    assert raised.value.last_id == ids[-1]
    assert raised.value.cursor == cursor
    assert raised.value.session_id == "s1"
    assert ids[-1] in str(raised.value)


async def test_trimmed_cursor_names_the_oldest_retained_id(
    backends: Backends, event_log_max_len: int
) -> None:
    # Given more frames than the log keeps
    ids = await _fill(backends, event_log_max_len * 3)
    oldest = (await backends.events.read("s1", None, 1))[0].event_id
    assert oldest is not None
    # When a client resumes from an id whose successors were trimmed
    with pytest.raises(EventCursorTrimmedError) as raised:
        await backends.events.read("s1", ids[0], 100)
    # Then the error says so, naming the oldest id still held and the last one
    assert raised.value.oldest_id == oldest
    assert raised.value.last_id == ids[-1]
    assert oldest in str(raised.value)
    assert isinstance(raised.value, EventCursorError)


async def test_log_keeps_exactly_its_bound_and_the_last_dropped_cursor_reads_on(
    backends: Backends, event_log_max_len: int
) -> None:
    # Given more frames than the log keeps
    ids = await _fill(backends, event_log_max_len * 2 + 7)
    # When the whole log is read, and a client resumes from the last dropped frame or later
    read = [e.event_id for e in await backends.events.read("s1", None, 10_000)]
    resumed = [
        e.event_id for e in await backends.events.read("s1", ids[-event_log_max_len - 1], 10_000)
    ]
    inside = [e.event_id for e in await backends.events.read("s1", ids[-5], 10_000)]
    # Then exactly the newest `bound` frames are held, and neither resume lost anything
    assert read == ids[-event_log_max_len:]
    assert resumed == ids[-event_log_max_len:]
    assert inside == ids[-4:]
    # ...while one frame earlier is a gap
    with pytest.raises(EventCursorTrimmedError):
        await backends.events.read("s1", ids[-event_log_max_len - 2], 10)


async def test_cursor_after_a_delete(backends: Backends) -> None:
    # Given a log of five frames, then the session's log deleted
    ids = await backends.events.append("s1", _frames(5))
    await backends.events.delete("s1")
    # Then a client at the last id has missed nothing, one further back missed the deleted
    # frames, and one from the future is still ahead
    assert await backends.events.read("s1", ids[-1], 100) == []
    with pytest.raises(EventCursorTrimmedError) as raised:
        await backends.events.read("s1", ids[1], 100)
    assert raised.value.oldest_id is None
    assert raised.value.last_id == ids[-1]
    with pytest.raises(EventCursorAheadError):
        await backends.events.read("s1", _after(ids[-1], ms=1000), 100)
    # When the session logs again
    new = await backends.events.append("s1", _frames(2))
    # Then ids went on growing, the client at the old last id reads exactly the new frames, and
    # the older cursor is still reported, now naming the oldest retained frame
    assert event_id_key(new[0]) > event_id_key(ids[-1])
    assert [e.event_id for e in await backends.events.read("s1", ids[-1], 100)] == new
    with pytest.raises(EventCursorTrimmedError) as again:
        await backends.events.read("s1", ids[1], 100)
    assert again.value.oldest_id == new[0]
    assert again.value.last_id == new[-1]


async def test_cursor_into_a_log_that_is_gone(backends: Backends) -> None:
    # Given a session without any log (never written, or expired with its whole log)
    # When a client resumes from a cursor
    with pytest.raises(EventCursorTrimmedError) as raised:
        await backends.events.read("nobody", "1-0", 100)
    # Then nothing can be replayed gap-free and the error says the log holds nothing
    assert raised.value.oldest_id is None
    assert raised.value.last_id is None
    # ...while a read from the start is simply empty
    assert await backends.events.read("nobody", None, 100) == []


async def test_cursor_before_every_retained_frame_without_drops_reads_all(
    backends: Backends,
) -> None:
    # Given a log that never dropped anything
    ids = await backends.events.append("s1", _frames(3))
    # When a client resumes from an id older than every frame
    read = await backends.events.read("s1", "0-1", 100)
    # Then it gets every frame: nothing after its cursor was ever dropped
    assert [e.event_id for e in read] == ids


@pytest.mark.parametrize("cursor", ["", "abc", "1-x", "-1-0", "1--2", "1-2-3"])
async def test_malformed_cursor_is_an_invalid_request(backends: Backends, cursor: str) -> None:
    await backends.events.append("s1", _frames(1))
    with pytest.raises(InvalidRequestError):
        await backends.events.read("s1", cursor, 10)


def test_cursor_errors_pickle_with_their_details() -> None:
    for error in (
        EventCursorTrimmedError(
            "gone", session_id="s1", cursor="1-0", oldest_id="5-0", last_id="9-0"
        ),
        EventCursorAheadError("ahead", session_id="s1", cursor="99-0", last_id="9-0"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (copy.message, copy.session_id, copy.cursor, copy.oldest_id, copy.last_id) == (
            error.message,
            error.session_id,
            error.cursor,
            error.oldest_id,
            error.last_id,
        )


@pytest.mark.parametrize("origin", ["0-0", "0"])
async def test_origin_cursor_reads_whatever_is_held(backends: Backends, origin: str) -> None:
    # Given no log yet, then a log that dropped frames past its bound
    # Then the origin (which no log issues as an id) reads like no cursor at all: it asks for
    # everything held (e.g. to replay a turn that started before subscribing), never raises
    assert await backends.events.read("s1", origin, 100) == []
    ids = await _fill(backends, 120)
    read = await backends.events.read("s1", origin, 1000)
    assert [e.event_id for e in read] == [
        e.event_id for e in await backends.events.read("s1", None, 1000)
    ]
    assert read[-1].event_id == ids[-1]
