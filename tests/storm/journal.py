"""The in-process storm's agent and its journal: every execution and injection, in one order.

The in-process cluster runs on a single event loop, so one counter orders everything: the
journal's clock (`tick`) stamps executions, injections and the callers' answers alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections import Counter
from collections.abc import Mapping
from typing import Any

from stickless import LiveSession, TextDelta, TranscriptEntry, TurnContext, TurnOutput, UserInput

from .records import Call, Execution, Injection, parse

#: How long a "long" turn works (unless interrupted): long enough to be caught mid-turn.
LONG_TURN = 0.4


def staged(text: str) -> tuple[str, ...]:
    """The transcript entries a turn of the storms' echoing agents stages for its input."""
    return (text, f"echo:{text}")


def echoed(call: Call) -> str:
    """The text of a successful answer of the storms' echoing agents."""
    return f"echo:{call.text}"


class Journal:
    """What every agent on every node did, in one order (the run has a single event loop)."""

    def __init__(self) -> None:
        self._clock = itertools.count(1)
        self.executions: list[Execution] = []
        self.injections: list[Injection] = []
        #: Turns running right now, per session.
        self.running: Counter[str] = Counter()
        #: Set while no turn runs anywhere.
        self.idle = asyncio.Event()
        self.idle.set()

    def tick(self) -> int:
        return next(self._clock)

    def start(self, turn: TurnContext, text: str) -> Execution:
        tag = parse(text)[1]
        execution = Execution(
            turn.session_id, turn.turn_id, tag, text, None, self.tick(), staged=staged(text)
        )
        self.executions.append(execution)
        self.running[turn.session_id] += 1
        self.idle.clear()
        return execution

    def end(self, execution: Execution, how: str) -> None:
        execution.end, execution.how = self.tick(), how
        self.running[execution.session_id] -= 1
        if not any(self.running.values()):
            self.idle.set()


class JournalAgent:
    """Works a small, input-derived time (or LONG_TURN), streams two frames, stages two
    transcript entries, honours interrupts, and takes some NOW messages into its turn."""

    def __init__(self, journal: Journal, session_id: str) -> None:
        self.journal = journal
        self.session_id = session_id
        self._turn: TurnContext | None = None

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        text = turn.input.as_text()
        execution = self.journal.start(turn, text)
        self._turn = turn
        how = "cancelled"
        try:
            pace = random.Random(text)  # derived from the input: a re-run paces alike
            turn.emit(TextDelta(text="working "))
            work = LONG_TURN if text.endswith("|long") else pace.choice((0.0, 0.001, 0.005))
            if work:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(turn.interrupted.wait(), work)
            else:
                for _ in range(pace.randint(1, 3)):
                    await asyncio.sleep(0)
            if turn.interrupted.is_set():
                how = "interrupted"
                return TurnOutput(text="interrupted")
            turn.emit(TextDelta(text=f"echo:{text}"))
            await turn.transcript.append(
                TranscriptEntry(role="user", content=text),
                TranscriptEntry(role="assistant", content=f"echo:{text}"),
            )
            how = "ok"  # returned normally with staged entries
            return TurnOutput(text=f"echo:{text}")
        finally:
            self._turn = None
            self.journal.end(execution, how)

    async def inject(self, item: UserInput) -> bool:
        turn = self._turn
        text = item.as_text()
        # Take about half of the NOW messages (decided by their input, so reproducibly).
        if turn is None or turn.interrupted.is_set() or random.Random(text).random() < 0.5:
            return False
        session_id, tag = parse(text)
        await turn.transcript.append(TranscriptEntry(role="user", content=text))
        journal = self.journal
        journal.injections.append(Injection(journal.tick(), session_id, tag, text, turn.turn_id))
        return True

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


class JournalOpener:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return JournalAgent(self.journal, session_id)
