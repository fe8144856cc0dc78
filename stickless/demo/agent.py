"""The demo's scripted agent: streams a canned reply word by word and stops when interrupted.

Per-turn behaviour comes from `submit_options`: `delay` (seconds between words, else the
agent's own), `story` (a long reply: the text itself, or `true` for `STORY`) and `recall` (report
how many entries were committed before this turn). Every finished turn commits the user's and
its own message to the transcript. A NOW message sent while a reply streams joins that turn
(`inject`): the reply acknowledges it in its text and the turn commits it as a user message too.
Agents living in the demo's own process also keep an `AgentLedger` of what they did, which the
in-process demo reports.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

from .._events import TextDelta
from .._session import TurnContext
from .._types import TranscriptEntry, TurnOutput, UserInput

#: Agent name every demo session is bound to.
AGENT_REF = "demo-agent"

#: Short router timings so every scene settles quickly (and the TTL fallbacks would too).
DEMO_CONFIG: dict[str, Any] = {
    "lease_ttl": 3.0,
    "lease_extend_interval": 1.0,
    "idempotency_secondary_ttl": 3.0,
    "holder_loss_sweep_interval": 1.0,
    "status_heartbeat_interval": 1.0,
    "forward_ttl": 20.0,
    "release_interrupt_timeout": 2.0,
    "interrupt_grace": 0.5,
}

#: The long reply of a turn submitted with `story: true`.
STORY = (
    "Once upon a time a request landed on a Ray node whose router did not hold its session, "
    "so the router forwarded it to the holder, which streamed every word to subscribers on "
    "other nodes, until somebody pressed stop or the holder's actor was killed"
)


@dataclass
class AgentLedger:
    """What the agents of one process did, per session."""

    executions: collections.Counter[str] = field(default_factory=collections.Counter)
    running: collections.Counter[str] = field(default_factory=collections.Counter)
    max_parallel: collections.Counter[str] = field(default_factory=collections.Counter)
    interrupts: list[tuple[str, str]] = field(default_factory=list)
    opened: collections.Counter[str] = field(default_factory=collections.Counter)


@dataclass
class _Said:
    """What a turn's reply said so far, and the NOW messages that joined it."""

    turn: TurnContext
    parts: list[str] = field(default_factory=list)
    #: Scripted words said (the acknowledgements not counted).
    words: int = 0
    joined: list[str] = field(default_factory=list)
    acknowledged: int = 0

    def say(self, text: str, scripted: bool = False) -> None:
        self.turn.emit(TextDelta(text=text + " "))
        self.parts.append(text)
        self.words += scripted

    def acknowledge(self) -> None:
        """Say that each message that joined since the last call was heard."""
        for message in self.joined[self.acknowledged :]:
            self.say(f"(you also said {message!r})")
        self.acknowledged = len(self.joined)


class ScriptedAgent:
    """A LiveSession that streams a scripted reply word by word and stops when interrupted."""

    def __init__(
        self, session_id: str, ledger: AgentLedger | None = None, token_delay: float = 0.02
    ) -> None:
        self._session_id = session_id
        self._ledger = ledger
        self._delay = token_delay
        self._turns = 0
        #: The reply streaming now (None between turns): NOW messages join it.
        self._streaming: _Said | None = None

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        """Stream the reply, then stage the user and assistant transcript entries."""
        ledger, sid = self._ledger, self._session_id
        if ledger is None:
            return await self._reply(turn)
        ledger.executions[sid] += 1
        ledger.running[sid] += 1
        ledger.max_parallel[sid] = max(ledger.max_parallel[sid], ledger.running[sid])
        try:
            return await self._reply(turn)
        finally:
            ledger.running[sid] -= 1

    async def _reply(self, turn: TurnContext) -> TurnOutput:
        options = turn.submit_options
        delay = options.get("delay", self._delay)
        delay = float(delay) if isinstance(delay, int | float) else self._delay
        self._turns += 1
        text = turn.input.as_text()
        data: dict[str, int] = {}
        story = options.get("story")
        if story:
            reply = story if isinstance(story, str) else STORY
        elif options.get("recall"):
            history = len(await turn.transcript.load())
            data["history"] = history
            reply = f"you said {text!r}; I can see {history} committed entries before this"
        else:
            reply = f"you said {text!r}; this handle has now run {self._turns} turn(s)"
        said = _Said(turn)
        self._streaming = said
        try:
            for word in reply.split():
                if turn.interrupted.is_set():
                    break
                said.acknowledge()
                said.say(word, scripted=True)
                await asyncio.sleep(delay)
        finally:
            self._streaming = None
        said.acknowledge()  # one taken during the last word: answered before the turn ends
        output = TurnOutput(text=" ".join(said.parts), data={**data, "words": said.words})
        if not turn.interrupted.is_set():
            await turn.transcript.append(
                TranscriptEntry(role="user", content=text),
                *(TranscriptEntry(role="user", content=message) for message in said.joined),
                TranscriptEntry(role="assistant", content=output.text),
            )
        return output

    async def inject(self, item: UserInput) -> bool:
        """Take a NOW message while a reply streams (not once it ended or was interrupted)."""
        said = self._streaming
        if said is None or said.turn.interrupted.is_set():
            return False
        said.joined.append(item.as_text())
        return True

    async def interrupt(self, reason: str) -> None:
        """Record the interrupt (with a ledger); the turn itself watches `turn.interrupted`."""
        if self._ledger is not None:
            self._ledger.interrupts.append((self._session_id, reason))

    async def aclose(self) -> None:
        """Nothing to release: the agent holds no outside resources."""
