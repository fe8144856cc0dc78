"""NOW injection racing the end of its turn, or a shutdown: every injected message is answered."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from stickless import LiveSession, Priority, TurnContext, TurnOutput, UserInput
from stickless.testing import LocalCluster

from .agents import req
from .conftest import FAST

#: A hang guard, not a speed bound: every answer here comes in milliseconds once it is due.
ANSWER_WITHIN = 10.0


class SlowInjectSession:
    """Its turns wait for `finish`; its `inject` waits for `accept` and then says True."""

    def __init__(self, controls: Controls) -> None:
        self.controls = controls

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        text = turn.input.as_text()
        self.controls.ran.append(text)
        if text == "long":
            self.controls.entered.set()
            await self.controls.finish.wait()
        return TurnOutput(text=f"echo:{text}")

    async def inject(self, item: UserInput) -> bool:
        self.controls.inject_called.set()
        await self.controls.accept.wait()
        return True

    async def interrupt(self, reason: str) -> None:
        self.controls.finish.set()

    async def aclose(self) -> None:
        return None


class Controls:
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.finish = asyncio.Event()
        self.inject_called = asyncio.Event()
        self.accept = asyncio.Event()
        self.ran: list[str] = []


class SlowInjectOpener:
    def __init__(self, controls: Controls) -> None:
        self.controls = controls

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return SlowInjectSession(self.controls)


async def test_a_message_accepted_after_its_turn_ended_is_still_answered() -> None:
    controls = Controls()
    async with LocalCluster(1, opener=SlowInjectOpener(controls), **FAST) as cluster:
        node = cluster.nodes[0]
        # Given a running turn and a NOW message offered to it, whose inject is still pending
        first = await node.submit(req("s1", "long"))
        await controls.entered.wait()
        urgent = await node.submit(req("s1", "urgent", priority=Priority.NOW, idempotency_key="u"))
        await controls.inject_called.wait()
        # When the turn ends before inject returns True
        controls.finish.set()
        assert (await first.result).text == "echo:long"
        controls.accept.set()
        # Then the message is answered (it runs as a turn of its own), not left waiting
        answer = await asyncio.wait_for(urgent.result, ANSWER_WITHIN)
        assert answer.turn_id == urgent.turn_id
        assert controls.ran == ["long", "urgent"]
        # And its key is settled: a retry gets the same answer without running again
        again = await node.submit(req("s1", "urgent", priority=Priority.NOW, idempotency_key="u"))
        assert (await asyncio.wait_for(again.result, ANSWER_WITHIN)).text == answer.text
        assert controls.ran == ["long", "urgent"]


async def test_a_shutdown_during_a_pending_injection_hands_the_message_on() -> None:
    controls = Controls()
    async with LocalCluster(2, opener=SlowInjectOpener(controls), **FAST) as cluster:
        holder, other = cluster.nodes
        # Given a running turn on one node and a NOW message whose inject is pending there
        first = await holder.submit(req("s1", "long"))
        await controls.entered.wait()
        urgent = await other.submit(req("s1", "urgent", priority=Priority.NOW))
        await controls.inject_called.wait()
        # When the holder shuts down (its turn ends, the pending injection is cut short)
        await holder.aclose(grace=0.1)
        await asyncio.gather(first.result, return_exceptions=True)
        # Then the message is not lost: it runs on the surviving node and its caller is answered
        answer = await asyncio.wait_for(urgent.result, ANSWER_WITHIN)
        assert answer.executed_by == other.node_id
        assert controls.ran.count("urgent") == 1
