"""The client storm: concurrent clients submit through random live nodes while a killer crashes
nodes (preferring one with a turn running) and waits for each to be replaced.

A client repeats one of its earlier requests now and then (same key, same input) instead of a
new one, and when its own node dies under it, it retries on another live node with the same
key, as application code would. The cluster plugs in through a `ClientCluster`.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Protocol

from stickless import TurnFailedError, TurnResult

from .records import Call, History, Kill


class ClientCluster(Protocol):
    """What a client storm needs of a cluster (nodes are opaque handles)."""

    #: A live node, as application code would pick one (waits, bounded, for one).
    def pick(self, dead: set[str]) -> Any: ...

    #: The name under which the storm remembers a node as dead.
    def handle_id(self, handle: Any) -> str: ...

    #: Whether `exc` says the caller's own node died under it.
    def died(self, exc: Exception) -> bool: ...

    #: A new request of `session` named `tag` (it may draw from `rng`).
    def request(self, session_id: str, tag: str, rng: random.Random) -> dict[str, Any]: ...

    #: Submit through `handle`; the new turn's id.
    async def submit(self, handle: Any, payload: dict[str, Any]) -> str: ...

    async def result(self, handle: Any, turn_id: str) -> TurnResult: ...

    #: Now, on the executions' clock (see `records.Execution.start`).
    def clock(self) -> float: ...

    #: The node to crash next (drawing from `rng`): one running a turn if there is one.
    def victim(self, rng: random.Random, dead: set[str]) -> Any: ...

    #: Crash it; the storm then counts it dead.
    def kill(self, victim: Any) -> Kill: ...

    #: Wait until the crashed node is replaced and the cluster is whole again.
    async def replaced(self, kill: Kill) -> None: ...


class ClientStorm:
    """The seeded workload over a `ClientCluster`, and its `history`."""

    def __init__(
        self,
        seed: int,
        cluster: ClientCluster,
        sessions: list[str],
        *,
        clients: int,
        kills: int,
        repeat: float,
        answer_within: float,
        pacing: tuple[float, float] = (1.0, 2.0),
    ) -> None:
        self.rng = random.Random(seed)
        self.cluster = cluster
        self.history = History(seed, sessions)
        self.clients = clients
        self.kills = kills
        self.repeat = repeat
        self.answer_within = answer_within
        self.pacing = pacing
        self.dead: set[str] = set()

    async def run_call(self, call: Call) -> None:
        try:
            await self._run_call(call)
        finally:
            call.done = time.monotonic()
            call.answered_at = self.cluster.clock()

    async def _run_call(self, call: Call) -> None:
        cluster, within = self.cluster, self.answer_within
        handle = cluster.pick(self.dead)
        call.sent = time.monotonic()
        deadline = call.sent + within
        while time.monotonic() < deadline:
            try:
                turn_id = await asyncio.wait_for(cluster.submit(handle, call.payload), within)
                call.attempts.append(turn_id)
                result = await asyncio.wait_for(cluster.result(handle, turn_id), within)
            except TurnFailedError as exc:
                call.error, call.turn_id = exc, exc.turn_id
                return
            except TimeoutError:
                call.hung = True
                return
            except Exception as exc:
                if not cluster.died(exc):
                    raise
                # Our own node died: retry elsewhere with the same key.
                call.retries += 1
                self.dead.add(cluster.handle_id(handle))
                handle = cluster.pick(self.dead)
                continue
            call.result, call.turn_id = result, result.turn_id
            return
        call.hung = True

    async def client(self, number: int, stop: asyncio.Event) -> None:
        rng = random.Random(self.rng.random())
        calls = self.history.calls
        issued: list[Call] = []
        while not stop.is_set():
            if issued and rng.random() < self.repeat:
                earlier = rng.choice(issued)
                call = Call(
                    len(calls),
                    earlier.session_id,
                    None,
                    earlier.tag,
                    earlier.text,
                    earlier.key,
                    repeat=True,
                    payload=earlier.payload,
                )
            else:
                session_id = rng.choice(self.history.sessions)
                tag = f"c{number}-{len(issued)}"
                payload = self.cluster.request(session_id, tag, rng)
                text, key = payload["input"], payload["idempotency_key"]
                call = Call(len(calls), session_id, None, tag, text, key, payload=payload)
                issued.append(call)
            calls.append(call)
            await self.run_call(call)

    async def killer(self, stop: asyncio.Event) -> None:
        try:
            for _ in range(self.kills):
                await asyncio.sleep(self.rng.uniform(*self.pacing))  # pacing, not a sync
                kill = self.cluster.kill(self.cluster.victim(self.rng, self.dead))
                self.dead.add(kill.node)
                self.history.kills.append(kill)
                await self.cluster.replaced(kill)
        finally:
            stop.set()

    async def run(self) -> History:
        stop = asyncio.Event()
        clients = (self.client(n, stop) for n in range(self.clients))
        await asyncio.gather(self.killer(stop), *clients)
        return self.history
