"""Stream completeness under the storm: open session streams, what they yielded, and the check
that every frame logged for a turn reached each of them once, in order (or a gap was reported).

`StreamWatch` keeps one `events()` stream per session open on a random live node process for
the whole storm, from the log's origin on. When its node dies (or refuses it) the stream is
opened again on another live node past the last event id it yielded, as a client resuming with
`Last-Event-ID` would; a resume the log can no longer serve (`EventCursorTrimmedError`) is a
gap, and so is one the node's stream sends (`take_gaps()`: a catch-up the log could not give
in full, such as a log out of reach for seconds). The storm's log never trims (its bound is
far above the frames a storm logs) and survives Redis restarts (append-only), so a gap there
is rare; each is printed when the watch closes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stickless._errors import EventCursorTrimmedError
from stickless.backends.base import Backends, event_id_key
from stickless.router import StreamGap
from stickless.router._stream import ORIGIN, logged_frames

from ..mp_cluster import poll

#: A frame's identity in a session: (turn id, attempt, seq).
FrameKey = tuple[str, int, int]
#: Seconds the streams get, once the storm's answers are in, to yield the log's last frame.
SETTLE_WITHIN = 15.0
#: Seconds between two attempts to open a stream while no node takes it.
_REOPEN_PAUSE = 0.05


@dataclass
class StreamRecord:
    """What one session stream yielded, across the nodes it was opened on, in order."""

    session_id: str
    #: Every frame yielded: (opening, event id, (turn id, attempt, seq)); the opening counts
    #: the times the stream was opened. A frame has no id when its node's relay call failed
    #: (its own streams get it, unlogged, or logged with an id it never learned).
    frames: list[tuple[int, str | None, FrameKey]] = field(default_factory=list)
    #: (cursor, oldest id then held) of every gap: a resume the log could no longer serve, or
    #: one the stream reported (a catch-up the log could not give in full; a None cursor: the
    #: stream did not know where it stood).
    gaps: list[tuple[str | None, str | None]] = field(default_factory=list)
    #: The nodes it was opened on, in order, with the cursor of each opening.
    nodes: list[tuple[str, str]] = field(default_factory=list)

    def note_gaps(self, gaps: Sequence[StreamGap]) -> None:
        self.gaps.extend((gap.cursor, gap.oldest_id) for gap in gaps)

    @property
    def last_id(self) -> str | None:
        ids = [event_id for _, event_id, _ in self.frames if event_id is not None]
        return ids[-1] if ids else None


class StreamWatch:
    """One open stream per session on a random live node (`alive()` gives node processes)."""

    def __init__(self, seed: int, alive: Callable[[], Sequence[Any]], sessions: list[str]) -> None:
        self._rng = random.Random(f"streams:{seed}")
        self._alive = alive
        self.records = [StreamRecord(session_id) for session_id in sessions]
        self._tasks: list[asyncio.Task[None]] = []

    async def open(self) -> None:
        """Open every session's stream; returns once each receives frames from every node."""
        opened = [asyncio.get_running_loop().create_future() for _ in self.records]
        for record, ready in zip(self.records, opened, strict=True):
            self._tasks.append(asyncio.ensure_future(self._follow(record, ready)))
        await asyncio.gather(*opened)

    async def _follow(self, record: StreamRecord, ready: asyncio.Future[None]) -> None:
        cursor = ORIGIN
        while True:
            alive = self._alive()
            if not alive:
                await asyncio.sleep(_REOPEN_PAUSE)  # (a pause between retries, not a sync)
                continue
            node = self._rng.choice(list(alive))
            record.nodes.append((node.node_id, cursor))
            stream = None
            try:
                stream = await node.client.events(record.session_id, after=cursor)
                await stream.ready()
                if not ready.done():
                    ready.set_result(None)
                opening = len(record.nodes)
                async for frame in stream:
                    record.note_gaps(stream.take_gaps())
                    key = (frame.turn_id, frame.attempt, frame.seq)
                    record.frames.append((opening, frame.event_id, key))
                    cursor = frame.event_id or cursor
                record.note_gaps(stream.take_gaps())
            except EventCursorTrimmedError as exc:
                record.gaps.append((cursor, exc.oldest_id))
                cursor = ORIGIN
            except Exception:  # its node died, or was cut off: resume on another
                if stream is not None:
                    record.note_gaps(stream.take_gaps())
                await asyncio.sleep(_REOPEN_PAUSE)  # (a pause between retries, not a sync)

    async def settle(self, backends: Backends) -> None:
        """Wait until every stream yielded its session's last logged frame (bounded)."""
        for record in self.records:
            logged = await _logged(backends, record.session_id)
            if not logged:
                continue
            last = logged[-1][0]

            async def caught_up(record: StreamRecord = record, last: str = last) -> bool:
                mine = record.last_id
                return mine is not None and event_id_key(mine) >= event_id_key(last)

            try:
                await poll(caught_up, SETTLE_WITHIN, f"stream of {record.session_id} silent")
            except AssertionError:
                return  # the check names what it missed

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for record in self.records:
            for cursor, oldest in record.gaps:
                print(f"stream of {record.session_id} reported a gap after {cursor} "
                      f"(oldest then {oldest}; on {record.nodes})")


async def _logged(backends: Backends, session_id: str) -> list[tuple[str, FrameKey, str]]:
    """(event id, key, type) of every frame the session's log holds."""
    frames = logged_frames(backends.events, session_id, None)
    return [
        (f.event_id, (f.turn_id, f.attempt, f.seq), f.type)
        async for f in frames
        if f.event_id is not None
    ]


async def stream_violations(records: list[StreamRecord], backends: Backends) -> list[str]:
    """Every frame logged for a turn reached each stream once, in order (per turn, by event
    id), unless a gap the stream reported covers it. Frames are matched by (turn, attempt,
    seq): one yielded without its id counts. Yielded again after a reopening, a frame the
    earlier opening gave without an id is no repeat (the resume cursor could not pass it)."""
    found: list[str] = []
    for record in records:
        logged = await _logged(backends, record.session_id)
        order: dict[FrameKey, tuple[int, int]] = {}
        for event_id, key, _ in logged:
            order.setdefault(key, event_id_key(event_id))
        found.extend(_repeats(record) + _disorder(record, order))
        seen = {key for _, _, key in record.frames}
        missed = [
            (event_id, kind)
            for event_id, key, kind in logged
            if key not in seen and not _in_gap(event_id, record.gaps)
        ]
        if missed:
            found.append(
                f"stream of {record.session_id} (on {record.nodes}) missed {len(missed)} "
                f"logged frame(s), first {missed[0][0]} ({missed[0][1]}), and reported no gap"
            )
    return found


def _repeats(record: StreamRecord) -> list[str]:
    """Frames yielded twice: in one opening (matched by key), or under one event id. (A frame
    the store logged twice — a finish whose reply was lost sends its frames again through the
    relay — may come once per id after a reopening, and one an earlier opening gave without
    an id may come again: the resume cursor could not pass it.)"""
    given: set[tuple[int, FrameKey]] = set()
    ids: set[str] = set()
    found: list[str] = []
    for opening, event_id, key in record.frames:
        again = (opening, key) in given or (event_id is not None and event_id in ids)
        given.add((opening, key))
        if event_id is not None:
            ids.add(event_id)
        if again:
            found.append(
                f"stream of {record.session_id} (on {record.nodes}) yielded {key} "
                f"({event_id}) twice, again in opening {opening}"
            )
    return found[:3]


def _disorder(record: StreamRecord, order: dict[FrameKey, tuple[int, int]]) -> list[str]:
    """A turn's frames yielded (first time each) out of their log order."""
    last: dict[str, tuple[int, int]] = {}
    given: set[FrameKey] = set()
    for _, _, key in record.frames:
        at = order.get(key)
        if at is None or key in given:
            continue  # (never logged, or a repeat: see `_repeats`)
        given.add(key)
        if at < last.get(key[0], (0, 0)):
            return [f"stream of {record.session_id} yielded turn {key[0]} out of order"]
        last[key[0]] = at
    return []


def _in_gap(event_id: str, gaps: list[tuple[str | None, str | None]]) -> bool:
    key = event_id_key(event_id)
    return any(
        event_id_key(cursor or ORIGIN) < key and (oldest is None or key < event_id_key(oldest))
        for cursor, oldest in gaps
    )
