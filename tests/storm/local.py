"""The in-process cluster (`LocalCluster`, one event loop) as a `WaveCluster`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from stickless import SessionRouter, SessionState, SubmitDisposition, SubmitRequest, TurnResult
from stickless.testing import LocalCluster

from .journal import Journal
from .records import Call, Kill

#: Router timings of the in-process storm (and of the focused repros of what it found).
SETTINGS: dict[str, Any] = dict(
    lease_ttl=1.0,
    lease_extend_interval=0.25,
    idempotency_secondary_ttl=0.5,
    holder_loss_sweep_interval=0.25,
    forward_ttl=15.0,
    release_interrupt_timeout=1.0,
    interrupt_grace=0.2,
    status_heartbeat_interval=0.5,
)


class LocalWaves:
    """Drives a `LocalCluster` whose nodes run the journal's agents."""

    def __init__(self, cluster: LocalCluster, journal: Journal) -> None:
        self.cluster = cluster
        self.journal = journal
        #: Nodes being killed: a caller still waiting on one must get RouterClosedError.
        self.dying: set[str] = set()

    def probe_spec(self, tag: str) -> str:
        return "long"

    def alive(self) -> list[SessionRouter]:
        return self.cluster.alive

    def clock(self) -> float:
        return self.journal.tick()

    async def submit(self, call: Call) -> None:
        request = SubmitRequest(
            session_id=call.session_id,
            agent_ref="bot",
            input=call.text,
            idempotency_key=call.key,
            priority=call.priority,
        )
        disposition = await call.node.submit(request)
        call.ticket, call.turn_id = disposition, disposition.turn_id
        call.kind = disposition.kind.value
        if call.node_id in self.dying and not disposition.result.done():
            call.pending_at_kill = True

    def answer(self, call: Call) -> Awaitable[TurnResult]:
        disposition: SubmitDisposition = call.ticket
        return disposition.result

    async def interrupt(self, node: SessionRouter, session_id: str, turn_id: str | None) -> None:
        await node.interrupt(session_id, reason="USER", turn_id=turn_id)

    async def release(self, node: SessionRouter, session_id: str) -> None:
        await node.release_session(session_id)

    async def runner_of(self, call: Call) -> SessionRouter | None:
        """The node whose status shows the call's turn running (polled; None if it ended)."""
        disposition: SubmitDisposition = call.ticket
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while loop.time() < deadline and not disposition.result.done():
            for node in self.cluster.alive:
                if call.session_id in node.local_sessions():
                    status = await node.status(call.session_id)
                    if (
                        status.state is SessionState.RUNNING
                        and status.active_turn_id == call.turn_id
                    ):
                        return node
            await asyncio.sleep(0.005)
        return None

    async def kill(self, victim: SessionRouter, calls: list[Call]) -> Kill:
        """Crash the node (it is mid-turn), noting whether it was running a turn."""
        running = [s for s in victim.local_sessions() if self.journal.running[s]]
        # (kill cuts the node off and marks it closed before its first await: any caller of
        # the node not answered by now must be answered with RouterClosedError)
        self.dying.add(victim.node_id)
        for call in calls:
            if call.node is victim and call.ticket and not call.ticket.result.done():
                call.pending_at_kill = True
        await self.cluster.kill(victim)
        return Kill(victim.node_id, time.monotonic(), mid_turn=bool(running))

    async def after_kill(self, kill: Kill, probes: list[Call]) -> None:
        return None

    async def add_node(self) -> Any:
        return await self.cluster.add_node()

    async def restart(self) -> None:
        raise NotImplementedError("the memory backends do not restart")
