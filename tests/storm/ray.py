"""The Ray deployment (tests/ray_deployment.py) as a `ClientCluster`: router actor handles,
killed with `ray.kill` and recreated by the reconciler; the agents log their executions to
Redis (tests/ray_agent.py)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stickless import TurnResult

from ..ray_agent import ExecutionRecord
from ..ray_cluster import wait_for
from ..ray_deployment import RAY_BOUND, Deployment, live, node_id, replaced, wait_armed
from .records import Execution, History, Kill


@dataclass
class RouterKill(Kill):
    """A router actor killed by the storm (`node` is its actor id)."""

    ray_node: str = ""
    router: str = ""  # the router's node id
    recreated_as: str = ""
    recreated_after: float = 0.0


class RayClients:
    """Drives a `Deployment` of routers."""

    def __init__(self, deployment: Deployment, holds: Sequence[float]) -> None:
        self.deployment = deployment
        #: Seconds a turn lasts, chosen per request.
        self.holds = holds

    def pick(self, dead: set[str]) -> Any:
        """A random live router, as application code would get from `any_router()`."""
        from stickless.ray import any_router

        return wait_for(
            lambda: live(any_router(self.deployment.namespace), dead),
            RAY_BOUND,
            "a live router",
        )

    def handle_id(self, handle: Any) -> str:
        return str(handle._actor_id.hex())

    def died(self, exc: Exception) -> bool:
        from ray.exceptions import RayActorError

        return isinstance(exc, RayActorError)  # (our own router died: ActorDiedError)

    def request(self, session_id: str, tag: str, rng: random.Random) -> dict[str, Any]:
        return self.deployment.request(session_id, tag, hold=rng.choice(self.holds))

    async def submit(self, handle: Any, payload: dict[str, Any]) -> str:
        ticket = await handle.submit.remote(payload)
        return str(ticket.turn_id)

    async def result(self, handle: Any, turn_id: str) -> TurnResult:
        result: TurnResult = await handle.result.remote(turn_id)
        return result

    def clock(self) -> float:
        return time.time()

    def victim(self, rng: random.Random, dead: set[str]) -> tuple[str, Any, bool]:
        """A router with a turn running on it right now if there is one, else any router."""
        handles = self.deployment.routers()
        by_actor = {self.handle_id(h): (node, h) for node, h in handles.items()}
        running: dict[str, str] = {}
        for record in self.deployment.log():
            if record.phase == "start":
                running[record.turn_id] = record.actor
            else:
                running.pop(record.turn_id, None)
        busy = sorted({a for a in running.values() if a in by_actor and a not in dead})
        if busy:
            node, handle = by_actor[rng.choice(busy)]
            return node, handle, True
        node = rng.choice(sorted(handles))
        return node, handles[node], False

    def kill(self, victim: tuple[str, Any, bool]) -> RouterKill:
        import ray

        ray_node, handle, mid_turn = victim
        router = node_id(handle)
        kill = RouterKill(
            self.handle_id(handle),
            0.0,
            stamp=self.deployment.redis_time(),  # (a turn it cut short ran until now)
            mid_turn=mid_turn,
            ray_node=ray_node,
            router=router,
        )
        kill.at = time.monotonic()
        ray.kill(handle)
        return kill

    async def replaced(self, kill: Kill) -> None:
        assert isinstance(kill, RouterKill)
        namespace = self.deployment.namespace
        kill.recreated_as = await asyncio.to_thread(
            wait_for, replaced(namespace, kill.ray_node, kill.router), RAY_BOUND, "recreated router"
        )
        kill.recreated_after = time.monotonic() - kill.at
        await asyncio.to_thread(wait_armed, namespace)

    def record(self, history: History) -> None:
        """The agents' log of the storm's sessions as executions (a turn's n-th start with its
        n-th end)."""
        ends: dict[str, list[ExecutionRecord]] = defaultdict(list)
        log = [r for r in self.deployment.log() if r.session_id in history.sessions]
        for record in log:
            if record.phase != "start":
                ends[record.turn_id].append(record)
        for start in (r for r in log if r.phase == "start"):
            end = ends[start.turn_id].pop(0) if ends[start.turn_id] else None
            history.executions.append(
                Execution(
                    start.session_id,
                    start.turn_id,
                    start.tag,
                    None,  # (the log does not carry the input)
                    start.actor,
                    start.time,
                    end.time if end is not None else None,
                    None if end is None else "ok" if end.phase == "end" else end.phase,
                    (f"{start.session_id}|{start.tag}",),
                )
            )
