"""Scripted agents for tests: they record what ran where, and can be held mid-turn."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from stickless import (
    FailureCode,
    LiveSession,
    SessionRouter,
    SubmitRequest,
    TerminalError,
    TextDelta,
    TranscriptEntry,
    TurnContext,
    TurnFailedError,
    TurnOutput,
    UserInput,
)


@dataclass
class Journal:
    """Shared record of every turn across the simulated cluster."""

    started: list[tuple[str, str, str]] = field(default_factory=list)  # (session, turn, text)
    finished: list[tuple[str, str]] = field(default_factory=list)
    running: dict[str, int] = field(default_factory=dict)
    max_concurrency: dict[str, int] = field(default_factory=dict)
    opened: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    interrupts: list[tuple[str, str]] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    #: Texts whose turns block until `release(text)` (or the turn is interrupted).
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    #: Set when a gated turn has started (so a test can act mid-turn).
    entered: dict[str, asyncio.Event] = field(default_factory=dict)
    accept_inject: bool = False
    #: (session, turn, text, attempt, fencing token) of every run.
    attempts: list[tuple[str, str, str, int, int]] = field(default_factory=list)
    #: Texts whose turns raise RuntimeError on their first n attempts.
    fail_first: dict[str, int] = field(default_factory=dict)
    #: Texts whose turns raise TerminalError.
    terminal: set[str] = field(default_factory=set)

    def gate(self, text: str) -> asyncio.Event:
        """Make turns whose input is `text` wait for the returned event; entered[text] is set
        when such a turn starts."""
        self.entered[text] = asyncio.Event()
        self.gates[text] = asyncio.Event()
        return self.gates[text]

    def texts(self, session_id: str) -> list[str]:
        return [t for s, _, t in self.started if s == session_id]


class ScriptedSession:
    """Streams its input back word by word; honours gates and interrupts."""

    def __init__(self, journal: Journal, session_id: str) -> None:
        self.journal = journal
        self.session_id = session_id

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        journal = self.journal
        text = turn.input.as_text()
        journal.started.append((turn.session_id, turn.turn_id, text))
        journal.attempts.append(
            (turn.session_id, turn.turn_id, text, turn.attempt, turn.fencing_token)
        )
        if text in journal.terminal:
            raise TerminalError(f"no retry can fix {text}")
        if turn.attempt <= journal.fail_first.get(text, 0):
            raise RuntimeError(f"flaky attempt {turn.attempt}")
        journal.running[turn.session_id] = journal.running.get(turn.session_id, 0) + 1
        journal.max_concurrency[turn.session_id] = max(
            journal.max_concurrency.get(turn.session_id, 0), journal.running[turn.session_id]
        )
        try:
            for word in text.split():
                turn.emit(TextDelta(text=word + " "))
                await asyncio.sleep(0)
            gate = journal.gates.get(text)
            if gate is not None:
                journal.entered[text].set()
                interrupted = asyncio.ensure_future(turn.interrupted.wait())
                released = asyncio.ensure_future(gate.wait())
                await asyncio.wait({interrupted, released}, return_when=asyncio.FIRST_COMPLETED)
                interrupted.cancel()
                released.cancel()
            await turn.transcript.append(
                TranscriptEntry(role="user", content=text),
                TranscriptEntry(role="assistant", content=f"echo:{text}"),
            )
            journal.finished.append((turn.session_id, turn.turn_id))
            return TurnOutput(text=f"echo:{text}", data={"words": len(text.split())})
        finally:
            journal.running[turn.session_id] -= 1

    async def interrupt(self, reason: str) -> None:
        self.journal.interrupts.append((self.session_id, reason))

    async def inject(self, item: UserInput) -> bool:
        if self.journal.accept_inject:
            self.journal.injected.append(item.as_text())
            return True
        return False

    async def aclose(self) -> None:
        self.journal.closed.append(self.session_id)


class ScriptedOpener:
    """Opens ScriptedSessions and records the attributes it was given."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        self.journal.opened.append((session_id, agent_ref, dict(attributes)))
        return ScriptedSession(self.journal, session_id)


async def wait_until(predicate: Any, within: float = 10.0) -> None:
    """Poll a condition that no event signals (store state, TTL expiry), bounded by `within`.

    `predicate` may be a plain function or a coroutine function.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def req(session: str, text: str, **kw: object) -> SubmitRequest:
    """A request for agent "bot" (keyword arguments are further SubmitRequest fields)."""
    return SubmitRequest(session_id=session, agent_ref="bot", input=text, **kw)  # type: ignore[arg-type]


async def failure_code(result: asyncio.Future[Any]) -> FailureCode | None:
    """The code a turn's caller was failed with, or None when it got a result."""
    try:
        await result
    except TurnFailedError as failed:
        return failed.code
    return None


def stall_take_overs(router: SessionRouter, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Make `router`'s take-overs hang for good (its collected messages stay pending, never
    started); the returned event is set once one is hanging."""
    stuck, never = asyncio.Event(), asyncio.Event()

    async def stalled_acquire(*args: object, **kwargs: object) -> object:
        stuck.set()
        await never.wait()
        raise AssertionError("unreachable")

    async def collect_only(
        session_id: str, max_priority: Any, token: int, *args: object, **kwargs: Any
    ) -> object:
        # (a take that would take the message over with the collect leaves that to the hanging
        # take-over at the turn's start)
        return await router.backends.inbox.collect(
            session_id, max_priority, token, reclaim_own=kwargs.get("reclaim_own", False)
        )

    monkeypatch.setattr(router.backends.idempotency, "acquire_holder", stalled_acquire)
    monkeypatch.setattr(router.backends.hotpath, "take", collect_only)
    return stuck
