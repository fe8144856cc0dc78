"""An actor's queue of turns that have not started, and the cancellations waiting for them."""

from __future__ import annotations

import heapq

from ._work import TurnWork

#: How many cancellations of turns not seen yet an actor remembers (the oldest are forgotten).
_REMEMBERED_CANCELLATIONS = 256
#: How many turn ids an actor remembers having admitted (to drop copies of a turn).
_REMEMBERED_TURNS = 1024


class Mailbox:
    """Turns not yet started, in priority then arrival order; any of them can be taken out."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, int], TurnWork]] = []
        #: Turn id -> reason, for interrupts that named a turn before it reached this actor.
        self._cancelled: dict[str, str] = {}
        #: Turn ids admitted lately (queued, run or answered here), oldest first.
        self._admitted: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def admit(self, turn_id: str) -> bool:
        """Note a turn entering this actor; False when it came before (a copy of a turn, e.g.
        delivered twice): a turn never runs twice here."""
        if turn_id in self._admitted:
            return False
        self._admitted[turn_id] = None
        while len(self._admitted) > _REMEMBERED_TURNS:
            del self._admitted[next(iter(self._admitted))]
        return True

    def push(self, work: TurnWork) -> None:
        heapq.heappush(self._heap, (work.sort_key, work))

    def pop(self) -> TurnWork:
        """The next turn to run. Raises: IndexError when empty."""
        return heapq.heappop(self._heap)[1]

    def quiet_head(self) -> bool:
        """Whether the next turn was reserved when nothing waited in the session's inbox (so
        no collect needs to go before it, unless the doorbell rang since)."""
        return bool(self._heap) and self._heap[0][1].inbox_quiet

    def take(self, turn_id: str) -> TurnWork | None:
        """Take a queued turn out by id (it will not run); None when it is not queued here."""
        for index, (_, work) in enumerate(self._heap):
            if work.turn_id == turn_id:
                self._heap.pop(index)
                heapq.heapify(self._heap)
                return work
        return None

    def drain(self) -> list[TurnWork]:
        """Everything queued, in order, leaving the mailbox empty."""
        works = [work for _, work in sorted(self._heap, key=lambda item: item[0])]
        self._heap.clear()
        return works

    def remember_cancel(self, turn_id: str, reason: str) -> None:
        """Cancel a turn that has not reached this mailbox yet, when (if) it arrives."""
        self._cancelled[turn_id] = reason
        while len(self._cancelled) > _REMEMBERED_CANCELLATIONS:
            del self._cancelled[next(iter(self._cancelled))]

    def cancelled(self, turn_id: str) -> str | None:
        """The reason a remembered cancellation of `turn_id` gave, consuming it."""
        return self._cancelled.pop(turn_id, None)
