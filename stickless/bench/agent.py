"""The bench agent: what every benchmark turn runs, in node processes and in-process routers.

Node processes load it by path (``--opener stickless.bench.agent:make_opener``). A turn's input
text is a spec:

- ``""`` or ``"echo"``: return at once, no frames, no transcript (the bare turn machinery);
- ``"commit"``: stage one transcript entry (committed by the runtime's fenced write);
- ``"relay:<paced|burst>:<count>:<interval>:<size>"``: emit `count` TextDelta frames whose text
  is ``"<time.time_ns()>:"`` padded with ``x`` to `size` characters; paced sleeps `interval`
  seconds between frames, burst only yields to the event loop (``sleep(0)``) between frames,
  the way an agent streaming tokens awaits its model between them;
- ``"sleep:<seconds>"``: wait that long unless the turn is interrupted first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from .._events import TextDelta
from .._session import TurnContext
from .._types import TranscriptEntry, TurnOutput

AGENT_REF = "bench-agent"


def relay_spec(mode: str, count: int, interval: float, size: int) -> str:
    """The input of a relay turn (see the module docstring)."""
    return f"relay:{mode}:{count}:{interval}:{size}"


def stamped_text(size: int) -> str:
    """``"<time.time_ns()>:"`` padded to `size` characters (the clock read last)."""
    head = f"{time.time_ns()}:"
    return head + "x" * max(0, size - len(head))


def sent_ns(text: str) -> int:
    """The send time embedded by `stamped_text`."""
    return int(text.partition(":")[0])


class BenchAgent:
    """One session's live handle (holds nothing but its session id)."""

    __slots__ = ("session_id",)

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        spec = turn.input.as_text()
        kind, _, rest = spec.partition(":")
        if kind == "relay":
            await _relay(turn, rest)
        elif kind == "commit":
            await turn.transcript.append(TranscriptEntry(role="user", content=turn.turn_id))
        elif kind == "sleep":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(turn.interrupted.wait(), float(rest))
        return TurnOutput(text="ok")

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def _relay(turn: TurnContext, rest: str) -> None:
    mode, count, interval, size = rest.split(":")
    paced = mode == "paced"
    pause = float(interval) if paced else 0.0
    width = int(size)
    for _ in range(int(count)):
        turn.emit(TextDelta(text=stamped_text(width)))
        await asyncio.sleep(pause)


class BenchOpener:
    """Opens a `BenchAgent` per session."""

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> BenchAgent:
        return BenchAgent(session_id)


def make_opener() -> BenchOpener:
    """Zero-argument factory named by ``stickless node --opener``."""
    return BenchOpener()
