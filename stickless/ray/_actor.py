"""The NodeRouter Ray actor: one SessionRouter over Redis per Ray node.

Its node id is `"<ray node id hex>/<incarnation>"`: a router that comes back on the same Ray node
is a new incarnation, so nothing it finds in Redis is mistaken for its own. With fast failover on,
each router keeps one never-returning call pending on every peer router; Ray fails that call
with `ActorDiedError` moments after the peer dies, and the router then revokes the dead peer's
leases and reservations at once (fencing keeps that safe) instead of waiting for TTLs.
`ActorUnavailableError` is transient (a slow or restarting node): the watch is simply re-armed.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

from .._config import DeploymentMode, RouterConfig
from .._events import Event
from .._logs import get_logger
from .._types import CommittedEntry, SubmitRequest, TurnResult
from ..metrics import RayMetrics
from ..node import NodeService, load_opener
from ..router import (
    ClusterSessionStatus,
    SessionRouter,
    StreamGap,
    SubmitDisposition,
    TurnInfo,
    with_gaps,
)

log = get_logger("stickless.ray")

#: Prefix of router actor names; the rest is the Ray node id (hex).
ROUTER_PREFIX = "stickless-router-"


@dataclass(frozen=True, slots=True)
class RouterTicket:
    """What `submit` returns: where the turn runs and how to fetch its result."""

    kind: str
    turn_id: str
    node_id: str
    session_id: str
    #: True when the request followed an earlier running turn with the same idempotency key.
    attached: bool = False
    #: "new", "attached" or "cached" (see `SubmitDisposition.origin`).
    origin: str = "new"
    #: The W3C trace the turn's frames name ('' for none known).
    trace_id: str = ""

    @classmethod
    def of(cls, disposition: SubmitDisposition) -> RouterTicket:
        """The ticket of a disposition."""
        return cls(
            kind=disposition.kind.value,
            turn_id=disposition.turn_id,
            node_id=disposition.node_id,
            session_id=disposition.session_id,
            attached=disposition.attached,
            origin=disposition.origin.value,
            trace_id=disposition.trace.trace_id if disposition.trace is not None else "",
        )


class NodeRouter:
    """Hosts one SessionRouter on this Ray node; application code calls its actor handle."""

    def __init__(
        self,
        redis_url: str,
        opener: str,
        namespace: str,
        config_overrides: Mapping[str, Any],
        fast_failover: bool = True,
        peer_scan_interval: float = 1.0,
    ) -> None:
        self.ray_node_id: str = ray.get_runtime_context().get_node_id()
        self.node_id = f"{self.ray_node_id}/{uuid.uuid4().hex[:8]}"
        self._redis_url = redis_url
        self._opener = opener
        self._namespace = namespace
        self._overrides = dict(config_overrides)
        self._fast_failover = fast_failover
        self._peer_scan_interval = peer_scan_interval
        self._service: NodeService | None = None
        self._starting: asyncio.Lock | None = None
        self._watched: dict[str, asyncio.Task[None]] = {}
        #: Peer routers whose death we would notice at once: actor name -> peer node id.
        self._watching: dict[str, str] = {}
        self._scanner: asyncio.Task[None] | None = None
        #: Seconds from a peer's death notice to its leases being revoked, per peer node id.
        self.failovers: dict[str, float] = {}

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Build and start the router (idempotent); returns this router's node id."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._service is None:
                from ..backends.redis import RedisBackends

                config = RouterConfig(
                    node_id=self.node_id,
                    node_incarnation=False,  # the id already names this actor's incarnation
                    mode=DeploymentMode.DISTRIBUTED,
                    **self._overrides,
                )
                backends = RedisBackends.from_url(self._redis_url, namespace=self._namespace)
                router = SessionRouter.build(
                    config=config,
                    opener=load_opener(self._opener),
                    backends=backends,
                    metrics=RayMetrics(self.node_id),
                )
                await router.start()
                self._service = NodeService(router)
                if self._fast_failover:
                    self._scanner = asyncio.get_running_loop().create_task(self._scan_peers())
        return self.node_id

    async def aclose(self, grace: float = 5.0) -> None:
        """Graceful shutdown of the hosted router (its sessions move to other routers)."""
        if self._scanner is not None:
            self._scanner.cancel()
        for task in self._watched.values():
            task.cancel()
        if self._service is not None:
            await self._service.aclose(grace=grace)
            await self._service.router.backends.aclose()

    async def _svc(self) -> NodeService:
        """The started service. A call that arrives before `start()` (the reconciler names a new
        router before it starts it, so `routers()` may hand it out early) waits for the start
        instead of failing."""
        if self._service is None:
            await self.start()
        service = self._service
        if service is None:  # pragma: no cover - start() always sets it or raises
            raise RuntimeError("NodeRouter.start() did not complete")
        return service

    # ------------------------------------------------------------ application API

    async def ping(self) -> dict[str, str]:
        return {"node_id": self.node_id, "ray_node_id": self.ray_node_id}

    async def pid(self) -> int:
        """The actor process's pid (benchmarks read its memory from /proc)."""
        return os.getpid()

    async def submit(self, request: SubmitRequest | Mapping[str, Any]) -> RouterTicket:
        """Submit a turn; returns a ticket (kind, turn_id, node_id) for `result`."""
        payload = (
            request.model_dump(mode="python") if isinstance(request, SubmitRequest) else request
        )
        service = await self._svc()
        ticket = await service.submit(payload)
        return RouterTicket(
            kind=str(ticket["kind"]),
            turn_id=str(ticket["turn_id"]),
            node_id=str(ticket["node_id"]),
            session_id=str(ticket["session_id"]),
            attached=bool(ticket["attached"]),
            origin=str(ticket["origin"]),
            trace_id=str(ticket.get("trace_id", "")),
        )

    async def result(
        self,
        turn_id: str,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the API's bound)
    ) -> TurnResult:
        """Await a turn: with `session_id` any turn of the cluster (whichever router took it,
        even a dead one), else one submitted on this router (raises TurnFailedError when it
        failed; see NodeService.result)."""
        service = await self._svc()
        return TurnResult.model_validate(await service.result(turn_id, session_id, timeout))

    async def turn(self, session_id: str, turn_id: str) -> TurnInfo:
        """The turn's state and answer, without waiting (see SessionRouter.turn)."""
        service = await self._svc()
        return await service.router.turn(session_id, turn_id)

    async def transcript(self, session_id: str) -> list[CommittedEntry]:
        """The session's committed transcript (see SessionRouter.transcript)."""
        service = await self._svc()
        return await service.router.transcript(session_id)

    async def stream(
        self, request: SubmitRequest | Mapping[str, Any]
    ) -> AsyncIterator[RouterTicket | Event | StreamGap]:
        """Submit and follow that turn (a Ray streaming generator): first the ticket, then the
        turn's frames up to its terminal one (see SessionRouter.stream), with a `StreamGap`
        where frames the event log no longer held were lost to it."""
        payload = (
            request.model_dump(mode="python") if isinstance(request, SubmitRequest) else request
        )
        service = await self._svc()
        stream = await service.stream(payload)
        try:
            yield RouterTicket.of(stream.disposition)
            async for item in with_gaps(stream):
                yield item
        finally:
            await stream.aclose()

    async def run(self, request: SubmitRequest | Mapping[str, Any]) -> TurnResult:
        """Submit and await the result."""
        ticket = await self.submit(request)
        return await self.result(ticket.turn_id)

    async def events(
        self, session_id: str, after: str | None = None, turn_id: str | None = None
    ) -> AsyncIterator[Event | StreamGap]:
        """Stream the session's frames (a Ray streaming generator; `after=` resumes), with a
        `StreamGap` where frames the event log no longer held were lost to the stream (see
        `EventStream.take_gaps`)."""
        service = await self._svc()
        stream = service.router.events(session_id, turn_id=turn_id, after=after)
        try:
            await stream.ready()
            async for item in with_gaps(stream):
                yield item
        finally:
            await stream.aclose()

    async def interrupt(
        self, session_id: str, reason: str = "USER", turn_id: str | None = None
    ) -> bool:
        """Whether a turn was interrupted or cancelled (see SessionRouter.interrupt)."""
        service = await self._svc()
        return await service.interrupt(session_id, reason=reason, turn_id=turn_id)

    async def release_session(self, session_id: str) -> None:
        service = await self._svc()
        await service.release_session(session_id)

    async def delete_session(self, session_id: str) -> None:
        service = await self._svc()
        await service.delete_session(session_id)

    async def status(self, session_id: str) -> ClusterSessionStatus:
        service = await self._svc()
        return await service.router.status(session_id)

    # ------------------------------------------------------------ failure detection

    async def watch(self) -> None:
        """Never returns: peers keep one call pending here to learn at once that we died."""
        await asyncio.Event().wait()

    async def peer_lost(self, node_id: str) -> list[str]:
        """Revoke a dead peer's leases and reservations now; returns the revoked sessions."""
        service = await self._svc()
        return await service.router.peer_lost(node_id)

    async def failover_times(self) -> dict[str, float]:
        return dict(self.failovers)

    async def watching(self) -> list[str]:
        """Node ids of the peer routers currently watched (fast failover armed for them)."""
        return sorted(self._watching.values())

    async def _scan_peers(self) -> None:
        own = ROUTER_PREFIX + self.ray_node_id
        while True:
            try:
                names = [
                    entry["name"]
                    for entry in ray.util.list_named_actors(all_namespaces=True)
                    if entry.get("namespace") == self._namespace
                    and str(entry.get("name", "")).startswith(ROUTER_PREFIX)
                    and entry["name"] != own
                ]
            except Exception as exc:
                log.warning("listing peer routers failed: %s", exc)
                names = []
            for name in names:
                if name not in self._watched:
                    self._watched[name] = asyncio.get_running_loop().create_task(
                        self._watch_peer(name)
                    )
            await asyncio.sleep(self._peer_scan_interval)

    async def _watch_peer(self, name: str) -> None:
        try:
            handle = ray.get_actor(name, namespace=self._namespace)
            peer = await handle.ping.remote()
            peer_node = str(peer["node_id"])
            self._watching[name] = peer_node
            while True:
                try:
                    await handle.watch.remote()
                except ActorUnavailableError:
                    await asyncio.sleep(0.5)  # transient: the peer may still be alive
                    continue
                except ActorDiedError:
                    started = asyncio.get_running_loop().time()
                    service = await self._svc()
                    revoked = await service.router.peer_lost(peer_node)
                    self.failovers[peer_node] = asyncio.get_running_loop().time() - started
                    log.warning("peer %s died; revoked %d lease(s)", peer_node, len(revoked))
                    return
        except ActorDiedError:
            return  # died before we could watch it; TTLs cover it
        except Exception as exc:
            log.warning("watching %s failed: %s", name, exc)
        finally:
            self._watched.pop(name, None)
            self._watching.pop(name, None)
