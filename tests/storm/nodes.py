"""Node processes (`stickless node`, tests/mp_cluster.py) as a `WaveCluster`.

The agent of the node processes (tests/mp_agent.py) logs the start and the end of every turn
into Redis, stamped with the server's clock; `record` turns that log into the storm's
executions. Callers stamp their answers with the wall clock of this host in microseconds (the
server runs on the same host, on loopback), so both can be compared.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections import defaultdict
from collections.abc import Awaitable

from stickless import TurnResult

from ..mp_cluster import LogEntry, MpCluster, NodeProcess, poll
from ..redis_fixture import RedisServer
from .journal import staged
from .records import Call, Execution, History, Kill, parse


class NodeWaves:
    """Drives an `MpCluster` (and restarts its redis-server)."""

    def __init__(self, cluster: MpCluster, server: RedisServer, sessions: list[str]) -> None:
        self.cluster = cluster
        self.server = server
        self.sessions = sessions

    def probe_spec(self, tag: str) -> str:
        return f"gate:{tag}"

    def alive(self) -> list[NodeProcess]:
        return self.cluster.alive

    def clock(self) -> float:
        return time.time_ns() // 1000

    async def submit(self, call: Call) -> None:
        assert call.priority is not None
        payload = {
            "session_id": call.session_id,
            "agent_ref": "bot",
            "input": call.text,
            "idempotency_key": call.key,
            "priority": call.priority.value,
        }
        call.ticket = await call.node.client.submit(payload)
        call.turn_id, call.kind = str(call.ticket["turn_id"]), str(call.ticket["kind"])

    def answer(self, call: Call) -> Awaitable[TurnResult]:
        assert call.turn_id is not None
        return call.node.client.result(call.turn_id)

    async def interrupt(self, node: NodeProcess, session_id: str, turn_id: str | None) -> None:
        await node.client.interrupt(session_id, reason="USER", turn_id=turn_id)

    async def release(self, node: NodeProcess, session_id: str) -> None:
        await node.client.release_session(session_id)

    async def runner_of(self, call: Call) -> NodeProcess | None:
        """The node process running the probe, from the agent's log (None: it was answered
        without running, e.g. released)."""
        found = await poll(
            functools.partial(self.probe_state, call),
            15,
            f"probe {call.tag} neither ran nor was answered",
        )
        return self.cluster.node(found.node) if isinstance(found, LogEntry) else None

    async def probe_state(self, call: Call) -> LogEntry | bool | None:
        """The probe's start entry; True when it was answered without running."""
        for entry in await self.cluster.log_entries(call.session_id):
            if entry.ev == "start" and entry.turn_id == call.turn_id:
                return entry
        return True if call.done else None

    async def kill(self, victim: NodeProcess, calls: list[Call]) -> Kill:
        """SIGKILL the node process; its turns cut short ran until it was reaped."""
        await victim.sigkill()
        return Kill(victim.node_id, time.monotonic(), stamp=await self.cluster.server_time())

    async def after_kill(self, kill: Kill, probes: list[Call]) -> None:
        kill.mid_turn = bool(await self.unfinished_on(kill.node))
        # Nobody waits on a probe any more: the victim's, and those never caught running (they
        # may have started since, or run again as a next attempt, and must end).
        for probe in probes:
            await self.cluster.open_gate(probe.tag)

    async def unfinished_on(self, node_id: str) -> list[str]:
        unfinished = []
        for execution in await self.executions(self.sessions):
            if execution.node == node_id and execution.end is None:
                unfinished.append(execution.turn_id)
        return unfinished

    async def add_node(self) -> NodeProcess:
        return await self.cluster.add_node()

    async def restart(self) -> None:
        await asyncio.to_thread(self.server.restart)

    # ------------------------------------------------------------ the journal

    async def executions(self, sessions: list[str]) -> list[Execution]:
        """The agent's log of `sessions` as executions (a turn's n-th start on a node with its
        n-th end there: attempts of one turn may run on several nodes, one cut short)."""
        found: list[Execution] = []
        for session_id in sessions:
            log = await self.cluster.log_entries(session_id)
            ends: dict[tuple[str, str], list[LogEntry]] = defaultdict(list)
            for entry in log:
                if entry.ev == "end":
                    ends[(entry.turn_id, entry.node)].append(entry)
            for start in (e for e in log if e.ev == "start"):
                mine = ends[(start.turn_id, start.node)]
                end = mine.pop(0) if mine else None
                found.append(
                    Execution(
                        session_id,
                        start.turn_id,
                        parse(start.text)[1],
                        start.text,
                        start.node,
                        start.stamp,
                        end.stamp if end is not None else None,
                        end.how if end is not None else None,
                        staged(start.text),
                    )
                )
        return found

    async def record(self, history: History) -> None:
        """Fill in the executions, and the collect failures the node processes logged."""
        history.executions = await self.executions(history.sessions)
        for path in sorted(self.cluster.log_dir.glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if found := re.search(r"collect failed for (\S+):", line):
                    history.collect_failures[found.group(1)] += 1
