"""`router.stream(request)`: one submitted turn's frames, from its first to its terminal one,
whether the submit started the turn, attached to it while it ran, or was answered from the
cache (see docs/architecture.md, "Turn lookup")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from .._errors import TurnFailedError
from .._events import (
    LATE_TERMINAL_SEQ,
    Event,
    TurnCompleted,
    TurnFailed,
    frame_trace,
    is_terminal,
    traced,
)
from .._trace import TraceContext
from ..backends.base import EventLog
from ._api import SubmitDisposition, SubmitOrigin
from ._stream import EventStream, StreamGap, logged_frames

#: Seconds the stream still waits for the turn's terminal frame once its answer is known (the
#: answer usually comes first: the frame follows through the relay). Past it, the log is read
#: once more and, without a terminal frame there either (a turn answered without running, such
#: as FORWARD_TIMEOUT), one is made from the answer.
TERMINAL_GRACE = 1.0


class TurnStream:
    """Async iterator over one turn's frames, ending with exactly one terminal frame.

    Made by `SessionRouter.stream`, whose live subscription was open before the submit, so a
    new turn's frames all arrive live; an attached or cached turn's earlier frames come from the
    event log first (frames in both are matched by attempt and seq and yielded once).
    """

    def __init__(
        self,
        disposition: SubmitDisposition,
        live: EventStream,
        log: EventLog,
        *,
        after: str | None = None,
        owns_answer: bool = False,
    ) -> None:
        self._disposition = disposition
        self._live = live
        self._log = log
        #: The log is read past this event id (a resumed follow), else from its start.
        self._after = after
        #: The answer future is this stream's own (a follow's lookup): closing cancels it.
        self._owns_answer = owns_answer
        self._seen: set[tuple[int, int]] = set()
        self._iterator: AsyncGenerator[Event, None] | None = None
        self._closed = False
        #: The turn's span as its frames name it: a terminal frame made here names it too.
        self._trace: TraceContext | None = None

    @property
    def disposition(self) -> SubmitDisposition:
        """The submit's answer: the turn id, where it runs, its result future, its origin."""
        return self._disposition

    @property
    def origin(self) -> SubmitOrigin:
        return self._disposition.origin

    def take_gaps(self) -> list[StreamGap]:
        """Frames of the session its live stream could not give since the last call (see
        `EventStream.take_gaps`; the turn's own frames among them are lost to this stream)."""
        return self._live.take_gaps()

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> Event:
        if self._iterator is None:
            self._iterator = self._frames()
        try:
            frame = await self._iterator.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            raise
        if self._trace is None and frame.trace_id:
            self._trace = frame_trace(frame)
        return frame

    async def aclose(self) -> None:
        """Stop the stream and its live subscription (the turn itself goes on)."""
        if self._closed:
            return
        self._closed = True
        if self._iterator is not None:
            # A reader that stopped early leaves `_followed` suspended with a read pending:
            # closing the generator runs its cleanup, which cancels and collects that read.
            with contextlib.suppress(RuntimeError):  # (another task is iterating it right now)
                await self._iterator.aclose()
        answer = self._disposition.result
        if self._owns_answer:
            if answer.done() and not answer.cancelled():
                answer.exception()  # read: an unread failure would be logged as lost
            answer.cancel()
        await self._live.aclose()

    async def __aenter__(self) -> TurnStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _first_time(self, frame: Event) -> bool:
        """True the first time a frame of the turn is met (by attempt and seq)."""
        mark = (frame.attempt, frame.seq)
        if mark in self._seen:
            return False
        self._seen.add(mark)
        return True

    async def _frames(self) -> AsyncGenerator[Event, None]:
        # Each inner generator is closed with this one (aclosing), so a reader that stops
        # early leaves no read pending.
        if self.origin is not SubmitOrigin.NEW:
            async with contextlib.aclosing(self._logged()) as logged:
                async for frame in logged:
                    yield frame
                    if is_terminal(frame):
                        return
        if self.origin is SubmitOrigin.CACHED:
            await self._live.aclose()
            yield self._made_terminal()
            return
        async with contextlib.aclosing(self._followed()) as followed:
            async for frame in followed:
                yield frame

    async def _logged(self) -> AsyncGenerator[Event, None]:
        """The turn's frames the event log holds, not yielded before (a whole read of the log:
        only an attached or cached turn, or a terminal frame overdue, needs it)."""
        turn_id = self._disposition.turn_id
        frames = logged_frames(self._log, self._disposition.session_id, self._after)
        async with contextlib.aclosing(frames):
            async for frame in frames:
                if frame.turn_id == turn_id and self._first_time(frame):
                    yield frame

    async def _followed(self) -> AsyncGenerator[Event, None]:
        """Live frames of the turn until its terminal one; once its answer is known, only for
        `TERMINAL_GRACE` more, then from the log, else one made from the answer."""
        turn_id = self._disposition.turn_id
        answer = self._disposition.result
        live = self._live.__aiter__()
        loop = asyncio.get_running_loop()
        grace_ends: float | None = None
        pending: asyncio.Future[Event] = asyncio.ensure_future(live.__anext__())
        try:
            while True:
                if grace_ends is None and answer.done():
                    grace_ends = loop.time() + TERMINAL_GRACE
                if grace_ends is None:
                    either: list[asyncio.Future[Any]] = [pending, answer]
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                else:
                    await asyncio.wait({pending}, timeout=max(grace_ends - loop.time(), 0.0))
                    if not pending.done():
                        break
                if not pending.done():
                    continue
                try:
                    frame = pending.result()
                except StopAsyncIteration:  # the live stream ended (evicted, or closing)
                    await asyncio.wait({answer})
                    break
                pending = asyncio.ensure_future(live.__anext__())
                if frame.turn_id == turn_id and self._first_time(frame):
                    yield frame
                    if is_terminal(frame):
                        return
        finally:
            pending.cancel()
            await asyncio.wait({pending})
        async for frame in self._logged():
            yield frame
            if is_terminal(frame):
                return
        yield self._made_terminal()

    def _made_terminal(self) -> Event:
        """The terminal frame of the turn's answer, for a turn whose own frame is not to be had.

        Raises:
            RouterClosedError: the router closed before the turn was answered.
        """
        disposition = self._disposition
        try:
            result = disposition.result.result()
        except TurnFailedError as failed:
            frame: Event = TurnFailed(
                session_id=disposition.session_id,
                turn_id=disposition.turn_id,
                seq=LATE_TERMINAL_SEQ,
                code=failed.code,
                message=failed.detail,
                executed_by=failed.executed_by,
            )
        else:
            frame = TurnCompleted(
                session_id=disposition.session_id,
                turn_id=disposition.turn_id,
                seq=LATE_TERMINAL_SEQ,
                text=result.text,
                data=result.data,
                executed_by=result.executed_by,
            )
        return traced(frame, self._trace or disposition.trace)


async def with_gaps(stream: EventStream | TurnStream) -> AsyncIterator[Event | StreamGap]:
    """The stream's frames with each gap it met where it lies (before the next frame, or at
    its end): what a caller across a boundary is sent, so it learns of a gap as one here does
    from `take_gaps()`. The caller closes the stream."""
    async for frame in stream:
        for gap in stream.take_gaps():
            yield gap
        yield frame
    for gap in stream.take_gaps():
        yield gap
