"""The application side: live sessions, their opener, and what a turn sees."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ._events import Event
from ._types import PrimitiveMap, Principal, Priority, TranscriptEntry, TurnOutput, UserInput


@runtime_checkable
class LiveSession(Protocol):
    """An expensive node-local handle to one session's agent (kept while the node holds it)."""

    async def run_turn(self, turn: TurnContext) -> TurnOutput: ...

    async def interrupt(self, reason: str) -> None: ...

    async def aclose(self) -> None: ...


class SupportsInject(Protocol):
    """Optional: accept a NOW message into the running turn (True when taken)."""

    async def inject(self, item: UserInput) -> bool: ...


class LiveSessionOpener(Protocol):
    """Opens a session's live handle on the node that holds the session."""

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession: ...


class Transcript:
    """A turn's view of the session history: committed entries plus this turn's staged ones."""

    def __init__(self, loader: Callable[[], Awaitable[Sequence[TranscriptEntry]]]) -> None:
        self._loader = loader
        self._staged: list[TranscriptEntry] = []

    async def load(self) -> list[TranscriptEntry]:
        """The session's committed entries (read from the record store, not from a cache)."""
        return list(await self._loader())

    async def append(self, *entries: TranscriptEntry) -> None:
        """Stage entries; they commit in one fenced write only if the turn succeeds."""
        for entry in entries:
            if not isinstance(entry, TranscriptEntry):
                raise TypeError(f"transcript entries must be TranscriptEntry, got {type(entry)!r}")
        self._staged.extend(entries)

    @property
    def staged(self) -> tuple[TranscriptEntry, ...]:
        return tuple(self._staged)


class TurnContext:
    """Everything one turn can see and do; `emit` never blocks."""

    def __init__(
        self,
        *,
        session_id: str,
        turn_id: str,
        input: UserInput,
        priority: Priority,
        submit_options: PrimitiveMap,
        initiator: Principal | None,
        emitter: Callable[[Event], None],
        transcript: Transcript,
        attempt: int = 1,
        fencing_token: int = 0,
    ) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.input = input
        self.priority = priority
        self.submit_options = submit_options
        self.initiator = initiator
        self.transcript = transcript
        #: Which run of this turn this is (1-based): a turn is run again after its holder was
        #: lost or it failed under a retry policy. With `turn_id` and `fencing_token` it gives
        #: stable idempotency keys for the agent's own side effects.
        self.attempt = attempt
        #: The lease token this attempt runs under: a later attempt always has a larger one or
        #: the same (retried on this node), and its writes fence out an older attempt's.
        self.fencing_token = fencing_token
        self.interrupted = asyncio.Event()
        self._emitter = emitter

    def emit(self, frame: Event) -> None:
        """Publish a frame to every subscriber; the relay stamps session, turn and seq."""
        self._emitter(frame)


SessionFactory = Callable[[str, str], Awaitable[LiveSession]]


class FactoryOpener:
    """Adapts `session_factory(session_id, agent_ref)` to the opener protocol (no attributes)."""

    def __init__(self, factory: SessionFactory) -> None:
        self._factory = factory

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return await self._factory(session_id, agent_ref)
