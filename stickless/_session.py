"""The application side: live sessions, their opener, and what a turn sees."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ._events import Event
from ._types import (
    CommittedEntry,
    PrimitiveMap,
    Principal,
    Priority,
    TranscriptEntry,
    TurnOutput,
    UserInput,
)


@runtime_checkable
class LiveSession(Protocol):
    """An expensive node-local handle to one session's agent (kept while the node holds it)."""

    async def run_turn(self, turn: TurnContext) -> TurnOutput: ...

    async def interrupt(self, reason: str) -> None: ...

    async def aclose(self) -> None: ...


class SupportsInject(Protocol):
    """Optional: accept a NOW message into the running turn (True when taken)."""

    async def inject(self, item: UserInput) -> bool: ...


@dataclass(frozen=True, slots=True)
class TurnEnding:
    """How a turn of this session ended, as recorded: whether its staged entries committed and
    the transcript's version then, so a session can keep a cached history current."""

    turn_id: str
    #: 'completed' or the failure code's name.
    result: str
    #: The staged entries are in the transcript (False: nothing committed, or not known to).
    committed: bool
    #: The transcript's version right after the commit (None when nothing committed): the
    #: turn's own entries are the last ones up to it.
    version: int | None = None
    #: Committed from a user interrupt: what the agent had staged when it stopped.
    partial: bool = False


class SupportsTurnEnding(Protocol):
    """Optional: be told how each turn ended once its answer is recorded (before the next turn
    of the session starts on this handle)."""

    async def turn_ended(self, ending: TurnEnding) -> None: ...


class LiveSessionOpener(Protocol):
    """Opens a session's live handle on the node that holds the session."""

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession: ...


#: Reads the session's committed entries after a version: (those entries, the version now).
TranscriptLoader = Callable[[int], Awaitable[tuple[Sequence[CommittedEntry], int]]]


class Transcript:
    """A turn's view of the session history: committed entries plus this turn's staged ones."""

    def __init__(self, loader: TranscriptLoader) -> None:
        self._loader = loader
        self._staged: list[TranscriptEntry] = []
        self._version: int | None = None

    async def load(self, after: int = 0) -> list[CommittedEntry]:
        """The entries committed after version `after` (all of them by default), read from the
        record store: an adapter that cached the history up to a version reads only what was
        added since, by any node.

        Raises:
            ValueError: `after` is not a version (an int >= 0).
        """
        entries, self._version = await self._loader(after)
        return list(entries)

    @property
    def version(self) -> int | None:
        """The committed version as of the last `load` (how many entries the transcript held
        then; None before the first load)."""
        return self._version

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
        """Publish a frame to every subscriber; the relay stamps session, turn and seq.

        A frame must fit one relay batch (`RouterConfig.max_relay_batch_bytes`, less about
        2 KiB): a longer `TextDelta` or `ReasoningDelta` goes out as several in a row, its text
        cut between characters (joined, they give the same text).

        Raises:
            FrameTooLargeError: any other frame over that bound (it is not sent).
        """
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
