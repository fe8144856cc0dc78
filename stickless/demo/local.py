"""`stickless demo`: the scenes on routers of this process (a `LocalCluster`) sharing in-memory
backends, or one Redis (`--redis URL`, each node with its own connections)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

from .._events import Event, is_terminal
from .._types import SubmitRequest
from ..router import ClusterSessionStatus, EventStream, SessionRouter
from ..testing import LocalCluster
from .agent import AGENT_REF, DEMO_CONFIG, AgentLedger
from .cluster import DemoError, Ticket
from .console import Console
from .narration import IN_PROCESS
from .opener import DemoOpener
from .scenes import play


class LocalSubscription:
    """A router's event stream of one session, registered when made."""

    def __init__(self, stream: EventStream) -> None:
        self._stream = stream

    async def frames(self, turn_id: str) -> AsyncIterator[Event]:
        async with self._stream:
            async for event in self._stream:
                if event.turn_id != turn_id:
                    continue
                yield event
                if is_terminal(event):
                    return


class LocalDemoCluster:
    """`DemoCluster` over a `LocalCluster`: nodes are routers of this process."""

    narration = IN_PROCESS
    patience = 1.0

    def __init__(self, cluster: LocalCluster, ledger: AgentLedger) -> None:
        self._cluster = cluster
        self.ledger: AgentLedger | None = ledger

    def nodes(self) -> list[str]:
        return [router.node_id for router in self._cluster.alive]

    def roster(self) -> list[str]:
        return [router.node_id for router in self._cluster.nodes]

    def label(self, node_id: str | None) -> str:
        return node_id or "?"

    def _router(self, node_id: str) -> SessionRouter:
        for router in self._cluster.nodes:
            if router.node_id == node_id:
                return router
        raise DemoError(f"no node {node_id}")

    async def submit(self, node: str, session_id: str, text: str, **extra: Any) -> Ticket:
        request = SubmitRequest(session_id=session_id, agent_ref=AGENT_REF, input=text, **extra)
        disp = await self._router(node).submit(request)
        # (the future itself, not a coroutine around it: awaiting adds no extra task hop)
        return Ticket(disp.kind.value, disp.turn_id, lambda: disp.result, ready=disp.result.done())

    async def subscribe(self, node: str, session_id: str) -> LocalSubscription:
        stream = self._router(node).events(session_id)
        await stream.ready()
        return LocalSubscription(stream)

    async def interrupt(self, node: str, session_id: str, reason: str) -> None:
        await self._router(node).interrupt(session_id, reason=reason)

    async def status(self, node: str, session_id: str) -> ClusterSessionStatus:
        return await self._router(node).status(session_id)

    async def kill(self, node: str) -> None:
        await self._cluster.kill(self._router(node))

    async def replacement(self, node: str) -> str | None:
        return None

    async def committed(self, session_id: str) -> int:
        view = await self._cluster.backends.records.load(session_id)
        return len(view.entries) if view is not None else 0


async def run_demo(nodes: int = 3, token_delay: float = 0.02, redis_url: str | None = None) -> int:
    """Run every scene on a fresh LocalCluster (in memory, or over Redis when `redis_url` is
    given); 0 when all of them showed what they should."""
    console = Console()
    ledger = AgentLedger()
    opener = DemoOpener(ledger, token_delay)
    if redis_url is None:
        cluster = LocalCluster(0, opener=opener, **DEMO_CONFIG)
        shared = "one shared in-memory backend"
    else:
        cluster = LocalCluster.over_redis(redis_url, 0, opener=opener, **DEMO_CONFIG)
        shared = f"Redis at {redis_url.rpartition('@')[2]} (each node with its own connections)"
    await cluster.start()
    try:
        for index in range(nodes):
            await cluster.add_node(f"node-{chr(ord('a') + index)}")
        console.line(
            "cluster",
            f"{nodes} nodes ({', '.join(n.node_id for n in cluster.nodes)}) over {shared}",
        )
        await play(LocalDemoCluster(cluster, ledger), console)
    except DemoError as exc:
        console.line("FAILED", str(exc))
        return 1
    finally:
        await cluster.aclose()
    console.line("done", f"demo finished in {console.elapsed():.2f}s")
    return 0


def main_demo(nodes: int, token_delay: float, redis_url: str | None, timeout: float) -> int:
    """`run_demo` under an overall time bound; the exit code."""

    async def bounded() -> int:
        try:
            return await asyncio.wait_for(run_demo(nodes, token_delay, redis_url), timeout)
        except TimeoutError:
            sys.stdout.write(f"\ndemo did not finish within {timeout:.0f}s\n")
            return 1

    return asyncio.run(bounded())
