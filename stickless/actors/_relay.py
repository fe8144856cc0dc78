"""Per-turn event relay.

The producer (the agent's `emit`) never blocks: frames go into a bounded ranked queue that a
dispatcher task drains in batches to the node's sink (event log, local subscribers, event rail).
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .._errors import FrameTooLargeError
from .._events import Event, ReasoningDelta, TextDelta, drop_rank, is_terminal, trace_fields
from .._logs import get_logger
from .._metrics import DROP_RANKS
from .._trace import TraceContext
from ..backends.base import TurnFrames
from ._sizes import FrameSizes, batch_budget, frame_cost, frame_limit, split_runs, split_text

log = get_logger("stickless.relay")

#: Loop passes a turn's first batch waits for more frames (or the turn's end) before it goes.
_FIRST_BATCH_PASSES = 4

#: Where a relay's batches go: (session_id, stamped frames) -> delivered.
FrameSink = Callable[[str, Sequence[Event]], Awaitable[None]]

#: The default `max_relay_batch_bytes` (see RouterConfig).
DEFAULT_BATCH_BYTES = 1024 * 1024


class Queued(NamedTuple):
    """A stamped frame and its encoded size (or a bound a few bytes over it: `FrameSizes`)."""

    frame: Event
    size: int


class RankedQueue:
    """Bounded FIFO whose overflow sheds the oldest frame of the lowest rank <= the incoming one.

    Rank 0 (reasoning) goes before rank 1 (text) before rank 2 (everything else); terminal frames
    are never shed while anything else can be.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: collections.deque[Queued] = collections.deque()
        self.dropped = 0
        #: Frames shed, by rank name (`DROP_RANKS`).
        self.shed: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, frame: Event, size: int = 0) -> None:
        """Queue `frame` (of encoded `size`), shedding another frame or it when full."""
        if len(self._items) >= self._capacity and not self._shed_for(frame):
            self._drop(frame)
            return
        self._items.append(Queued(frame, size))

    def _drop(self, frame: Event) -> None:
        self.dropped += 1
        self.shed[DROP_RANKS[drop_rank(frame)]] += 1

    def _shed_for(self, incoming: Event) -> bool:
        """Make room for `incoming`; False when `incoming` itself should be dropped."""
        incoming_rank = drop_rank(incoming)
        for rank in range(incoming_rank + 1):
            for index, (frame, _) in enumerate(self._items):
                if drop_rank(frame) == rank and not is_terminal(frame):
                    del self._items[index]
                    self._drop(frame)
                    return True
        # A terminal frame is kept even past capacity; anything else is dropped.
        return is_terminal(incoming)

    def take_all(self) -> list[Queued]:
        items = list(self._items)
        self._items.clear()
        return items


class EventRelay:
    """Stamps one turn's frames and hands them to the sink through a dispatcher task.

    `after` is the previous turn's relay of the session: this one dispatches nothing before that
    one has flushed, so a session's frames reach the log and the rail in turn order even though
    a turn's caller is answered without waiting for its relay to flush. Every batch handed to
    the sink encodes to at most `max_batch_bytes` (see `_sizes`).
    """

    def __init__(
        self,
        session_id: str,
        turn_id: str,
        sink: FrameSink,
        capacity: int,
        after: EventRelay | None = None,
        attempt: int = 1,
        trace: TraceContext | None = None,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.attempt = attempt
        self._trace = trace_fields(trace)
        self._sink = sink
        self._after = after
        self._queue = RankedQueue(capacity)
        self._budget = batch_budget(max_batch_bytes)
        self._frame_limit = frame_limit(max_batch_bytes)
        self._sizes = FrameSizes()
        self._seq = 0
        self._wake = asyncio.Event()
        self._closed = False
        #: Frames emitted after the turn ended, by rank name.
        self._late: collections.Counter[str] = collections.Counter()
        #: Sealed: what is left goes out with the turn's finish (see `seal`), and the
        #: dispatcher ends once that happened (`hand_over`).
        self._sealed = False
        self._parked = asyncio.Event()
        self._handed_over = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._dispatch(), name=f"relay:{session_id}:{turn_id}"
        )

    @property
    def dropped(self) -> int:
        """Frames shed by overflow or emitted after the turn ended."""
        return self._queue.dropped + self._late.total()

    @property
    def drops(self) -> dict[str, int]:
        """`dropped` by rank name (`DROP_RANKS`), ranks without a drop left out."""
        return dict(self._queue.shed + self._late)

    def emit(self, frame: Event) -> None:
        """Stamp and enqueue a frame, a text or reasoning delta over the frame bound as several
        (its text cut between characters); never blocks, never raises for a full queue.

        Raises:
            FrameTooLargeError: any other frame is over the bound (nothing is enqueued).
        """
        if self._closed:
            self._late[DROP_RANKS[drop_rank(frame)]] += 1
            return
        pieces = self._bounded(frame)
        self._seq += len(pieces)
        for piece in pieces:
            self._queue.push(*piece)
        if is_terminal(pieces[-1].frame):
            self._closed = True
        self._wake.set()

    def _bounded(self, frame: Event) -> list[Queued]:
        """The frame stamped as the turn's next one, or a delta over the bound as the next
        several, each with its encoded size (the turn's seq is not advanced here).

        Raises:
            FrameTooLargeError: a frame over the bound that is not a delta.
        """
        stamped = self.stamp(frame, self._seq + 1)
        size = self._sizes.of(stamped)
        if size <= self._frame_limit:
            return [Queued(stamped, size)]
        if not isinstance(stamped, TextDelta | ReasoningDelta):
            raise FrameTooLargeError(
                f"{stamped.type} frame encodes to {size} bytes, over the frame bound of "
                f"{self._frame_limit} bytes (max_relay_batch_bytes less the batch's envelope); "
                "only text_delta and reasoning_delta frames are cut to fit"
            )
        text = stamped.text
        # (a delta's size bound holds for any seq: see FrameSizes)
        room = self._frame_limit - (size - len(text.encode("utf-8")))
        pieces: list[Queued] = []
        for n, part in enumerate(split_text(text, room), start=self._seq + 1):
            piece = stamped.model_copy(update={"text": part, "seq": n})
            pieces.append(Queued(piece, self._sizes.of(piece)))
        return pieces

    def stamp(self, frame: Event, seq: int | None = None) -> Event:
        """The frame as this turn's next one (or as its frame number `seq`)."""
        if seq is None:
            self._seq += 1
            seq = self._seq
        update = {
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "attempt": self.attempt,
            "seq": seq,
            **self._trace,
        }
        return frame.model_copy(update=update)

    async def seal(self) -> list[Queued]:
        """End dispatching and take over what is still queued: the turn's finish sends it with
        the terminal frame (`last_frames`). Waits for the previous turn's relay and for a batch
        in flight, so the frames keep their order in the log; frames emitted later are dropped."""
        self._closed = self._sealed = True
        self._wake.set()
        parked = asyncio.ensure_future(self._parked.wait())
        try:
            await asyncio.wait({parked, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            parked.cancel()
        return self._queue.take_all()

    async def last_frames(self, tail: Sequence[Queued], terminal: Event) -> LastFrames:
        """The turn's last frames for its finish to send in one batch: `terminal` (stamped)
        and the end of `tail` that fits one batch with it; the rest of `tail` goes to the sink
        first, in bounded batches, so every frame keeps its place."""
        queued = [*tail, Queued(terminal, self._sizes.of(terminal))]
        ahead = len(queued) - split_runs([frame_cost(q.size) for q in queued], self._budget)[-1]
        await self._send_runs(queued[:ahead])
        last = queued[ahead:]
        frames = TurnFrames(uuid.uuid4().hex, tuple(q.frame for q in last))
        return LastFrames(self, tuple(last[:-1]), frames)

    async def hand_over(self, frames: Sequence[Event] = ()) -> None:
        """End a sealed relay: send `frames` to the sink first (those its finish did not
        log: one batch's worth), then let the dispatcher end."""
        if frames:
            await self._send(frames)
        self.release()

    def release(self) -> None:
        """End a sealed relay whose last frames went out another way (its finish logged them)."""
        self._handed_over.set()

    def close(self) -> None:
        """End the turn's stream without a terminal frame of its own (another node ended the
        turn and sent that frame); what is queued is still dispatched."""
        self._closed = True
        self._wake.set()

    async def flushed(self, flush_timeout: float) -> None:
        """Wait (bounded) until the dispatcher has handed over everything, terminal included."""
        done, _ = await asyncio.wait({self._task}, timeout=flush_timeout)
        if not done:
            log.warning(
                "relay %s/%s did not flush in %.1fs", self.session_id, self.turn_id, flush_timeout
            )

    def on_flushed(self, callback: Callable[[EventRelay], None]) -> None:
        """Call `callback(self)` once the dispatcher has ended."""
        self._task.add_done_callback(lambda _: callback(self))

    def abort(self) -> None:
        """Stop the dispatcher without flushing (the node is dying)."""
        self._task.cancel()

    async def _dispatch(self) -> None:
        previous, self._after = self._after, None
        if previous is not None:
            await asyncio.wait({previous._task})
        first = True
        while not self._sealed:
            self._parked.set()
            await self._wake.wait()
            self._parked.clear()
            if first:
                # The turn's first frame waits a few loop passes: a turn that ends within them
                # sends every frame with its finish, in one store call with the answer.
                first = False
                for _ in range(_FIRST_BATCH_PASSES):
                    await asyncio.sleep(0)
            self._wake.clear()
            if self._sealed:
                break
            await self._send_runs(self._queue.take_all())
            if self._closed and not self._sealed and not len(self._queue):
                return
        self._parked.set()
        await self._handed_over.wait()

    async def _send_runs(self, queued: Sequence[Queued]) -> None:
        """Send frames to the sink in order, as runs that each fit one batch."""
        start = 0
        for length in split_runs([frame_cost(q.size) for q in queued], self._budget):
            await self._send([q.frame for q in queued[start : start + length]])
            start += length

    async def _send(self, frames: Sequence[Event]) -> None:
        """One batch to the sink; a failure is logged (the sink answers local subscribers)."""
        try:
            await self._sink(self.session_id, frames)
        except Exception:
            log.exception("relay sink failed for %s", self.session_id)


@dataclass(eq=False)
class LastFrames:
    """A turn's last frames, its terminal one last, taken from its sealed relay (one batch's
    worth: see `EventRelay.last_frames`): the finish logs and publishes them in its own store
    step when it records the turn's answer, else sends them through the relay (`send`), the
    terminal frame only with `terminal`."""

    relay: EventRelay
    #: The frames before the terminal one, with their sizes.
    tail: tuple[Queued, ...]
    frames: TurnFrames
    consumed: bool = False

    @property
    def terminal(self) -> Event:
        return self.frames.frames[-1]

    async def replaced(self, terminal: Event) -> LastFrames:
        """The same frames ending with another terminal frame (a new batch; what no longer
        fits it goes out through the relay first)."""
        return await self.relay.last_frames(self.tail, terminal)

    def logged(self) -> None:
        """The finish logged and published them: the relay ends."""
        self.consumed = True
        self.relay.release()

    async def send(self, terminal: bool) -> None:
        """Send them through the relay's sink instead (the terminal frame only if `terminal`)."""
        self.consumed = True
        frames = self.frames.frames
        await self.relay.hand_over(frames if terminal else frames[:-1])
