"""A session caches its history: each turn reads only what was committed since the version it
knows (from any node), and is told whether its own entries committed and at which version; a
turn the user interrupted commits what it staged, marked partial, when the deployment asks."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from stickless import (
    FailureCode,
    LiveSession,
    TranscriptEntry,
    TurnContext,
    TurnEnding,
    TurnFailedError,
    TurnOutput,
)
from stickless.testing import LocalCluster

from .agents import req
from .conftest import BACKENDS, FAST


@dataclass
class Seen:
    """What every caching session of a test read and was told, across nodes."""

    #: (node, turn input, entries read, version read)
    loads: list[tuple[str, str, list[str], int | None]] = field(default_factory=list)
    endings: list[TurnEnding] = field(default_factory=list)
    #: Inputs whose turn waits (staged already) until the event is set or it is interrupted.
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    entered: dict[str, asyncio.Event] = field(default_factory=dict)


class CachingSession:
    """Keeps the history it read; reads only what came after its version."""

    def __init__(self, seen: Seen, node: str) -> None:
        self.seen = seen
        self.node = node
        self.history: list[TranscriptEntry] = []
        self.version = 0
        #: This turn's staged entries, until the turn's ending says whether they committed.
        self.staged: list[TranscriptEntry] = []

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        text = turn.input.as_text()
        if text == "boom":
            await turn.transcript.append(TranscriptEntry(role="user", content=text))
            raise RuntimeError("the agent failed")
        added = await turn.transcript.load(after=self.version)
        self.history.extend(added)
        self.seen.loads.append(
            (self.node, text, [e.content for e in added], turn.transcript.version)
        )
        self.version = turn.transcript.version or 0
        self.staged = [
            TranscriptEntry(role="user", content=text, data={"message": {"parts": [text]}})
        ]
        gate = self.seen.gates.get(text)
        if gate is not None:
            self.staged.append(TranscriptEntry(role="assistant", content="partial"))
            await turn.transcript.append(*self.staged)
            self.seen.entered[text].set()
            waiting = asyncio.ensure_future(gate.wait())
            stopped = asyncio.ensure_future(turn.interrupted.wait())
            await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            stopped.cancel()
            return TurnOutput(text="stopped")
        self.staged.append(TranscriptEntry(role="assistant", content=f"re:{text}"))
        await turn.transcript.append(*self.staged)
        return TurnOutput(text=f"re:{text}")

    async def turn_ended(self, ending: TurnEnding) -> None:
        self.seen.endings.append(ending)
        # Its own entries are the last ones up to the version: when nothing else committed in
        # between, the cache takes them without reading them back (else the next load does).
        if ending.committed and ending.version == self.version + len(self.staged):
            self.history.extend(self.staged)
            self.version = ending.version
        self.staged = []

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


class CachingOpener:
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return CachingSession(self.seen, attributes.get("options", {}).get("node", "?"))


def _cluster(request: pytest.FixtureRequest, seen: Seen, **overrides: Any) -> LocalCluster:
    opener = CachingOpener(seen)
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        return LocalCluster.over_redis(url, 2, opener=opener, **{**FAST, **overrides})
    return LocalCluster(2, opener=opener, **{**FAST, **overrides})


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> pytest.FixtureRequest:
    return request


async def _turn(node: Any, text: str) -> str:
    result = await (await node.submit(req("s1", text, options={"node": node.node_id}))).result
    return str(result.text)


async def test_each_turn_reads_only_what_was_committed_since_it_last_looked(
    backend: pytest.FixtureRequest,
) -> None:
    seen = Seen()
    async with _cluster(backend, seen) as cluster:
        a, b = cluster.nodes
        # Turns 1 and 2 on A, then the session moves to B (A gives it up), then back to A
        assert await _turn(a, "one") == "re:one"
        assert await _turn(a, "two") == "re:two"
        await a.release_session("s1")
        assert await _turn(b, "three") == "re:three"
        await b.release_session("s1")
        assert await _turn(a, "four") == "re:four"
    loads = [(node, text, read, version) for node, text, read, version in seen.loads]
    assert loads == [
        (a.node_id, "one", [], 0),
        # A's handle was told its turn committed at version 2: it reads nothing back
        (a.node_id, "two", [], 2),
        # B's new handle reads the whole history once
        (b.node_id, "three", ["one", "re:one", "two", "re:two"], 4),
        # A's new handle (A gave the session up, so its handle closed) reads it all too
        (a.node_id, "four", ["one", "re:one", "two", "re:two", "three", "re:three"], 6),
    ]
    assert [(e.result, e.committed, e.version, e.partial) for e in seen.endings] == [
        ("completed", True, 2, False),
        ("completed", True, 4, False),
        ("completed", True, 6, False),
        ("completed", True, 8, False),
    ]


async def test_a_failed_turn_tells_its_session_nothing_committed(
    backend: pytest.FixtureRequest,
) -> None:
    seen = Seen()
    async with _cluster(backend, seen) as cluster:
        a, _ = cluster.nodes
        await _turn(a, "one")
        with pytest.raises(TurnFailedError):
            await _turn(a, "boom")
        await _turn(a, "after")
        record = await cluster.backends.records.load("s1")
    assert [(e.result, e.committed, e.version) for e in seen.endings] == [
        ("completed", True, 2),
        ("FAILED", False, None),
        ("completed", True, 4),
    ]
    assert record is not None and [e.content for e in record.entries] == [
        "one",
        "re:one",
        "after",
        "re:after",
    ]


@pytest.mark.parametrize("commit_partial", [True, False])
async def test_an_interrupted_turn_commits_what_it_staged_only_when_asked(
    backend: pytest.FixtureRequest, commit_partial: bool
) -> None:
    seen = Seen(gates={"long": asyncio.Event()}, entered={"long": asyncio.Event()})
    async with _cluster(backend, seen, commit_partial_on_interrupt=commit_partial) as cluster:
        a, b = cluster.nodes
        await _turn(a, "one")
        running = await a.submit(req("s1", "long", options={"node": a.node_id}))
        await seen.entered["long"].wait()
        # The user interrupts it from the other node
        assert await b.interrupt("s1") is True
        with pytest.raises(TurnFailedError) as failure:
            await running.result
        after = await _turn(a, "next")
        record = await cluster.backends.records.load("s1")
    assert failure.value.code is FailureCode.INTERRUPTED and after == "re:next"
    assert record is not None
    kept = [(e.content, e.partial) for e in record.entries]
    if commit_partial:
        assert kept == [
            ("one", False),
            ("re:one", False),
            ("long", True),
            ("partial", True),
            ("next", False),
            ("re:next", False),
        ]
        assert (seen.endings[1].result, seen.endings[1].committed) == ("INTERRUPTED", True)
        assert (seen.endings[1].version, seen.endings[1].partial) == (4, True)
    else:
        assert kept == [("one", False), ("re:one", False), ("next", False), ("re:next", False)]
        assert (seen.endings[1].committed, seen.endings[1].partial) == (False, False)
