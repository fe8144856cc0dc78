"""Helpers shared by the scenarios: in-process routers over the run's Redis, raw clients,
server-side command counts, RSS."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .._config import DeploymentMode, RouterConfig
from ..router import SessionRouter
from .agent import AGENT_REF, make_opener

if TYPE_CHECKING:
    import redis.asyncio

    from ..backends.redis import RedisBackends


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def request(session_id: str, spec: str = "echo") -> dict[str, Any]:
    """A submit request for the bench agent."""
    return {"session_id": session_id, "agent_ref": AGENT_REF, "input": spec}


async def claim_all(router: SessionRouter, sessions: list[str], callers: int) -> float:
    """One turn per session (each claims its session) by `callers` callers; claims per second."""
    queue = list(reversed(sessions))

    async def caller() -> None:
        while queue:
            session_id = queue.pop()
            await (await router.submit(request(session_id))).result

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return len(sessions) / (time.perf_counter() - t0)


def script_names() -> dict[str, str]:
    """SHA1 -> name of every Lua script the Redis backends load."""
    from importlib.resources import files

    from ..backends.redis import _scripts

    lua = files(_scripts.__package__).joinpath("lua")
    names = [p.name[:-4] for p in lua.iterdir() if p.name.endswith(".lua") and p.name[0] != "_"]
    return {hashlib.sha1(_scripts.source(n).encode()).hexdigest(): n for n in sorted(names)}


def raw_client(url: str) -> redis.asyncio.Redis:
    """A plain redis-py asyncio client (hiredis parser when installed), as an app would use."""
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url, socket_timeout=10.0)


@contextlib.asynccontextmanager
async def redis_router(
    url: str,
    namespace: str,
    node_id: str,
    client_options: dict[str, Any] | None = None,
    **config: Any,
) -> AsyncIterator[tuple[SessionRouter, RedisBackends]]:
    """A DISTRIBUTED router in this process over the run's Redis, running the bench agent
    (`client_options` go to `RedisBackends.from_url`)."""
    from ..backends.redis import RedisBackends

    backends = RedisBackends.from_url(url, namespace=namespace, **(client_options or {}))
    router = SessionRouter.build(
        config=RouterConfig(node_id=node_id, mode=DeploymentMode.DISTRIBUTED, **config),
        opener=make_opener(),
        backends=backends,
    )
    await router.start()
    try:
        yield router, backends
    finally:
        try:
            await router.aclose(grace=1.0)
        finally:
            await backends.aclose()


class ClientGauge:
    """Samples the server's connected_clients while open (the peak is kept)."""

    def __init__(self, url: str, every: float = 0.05) -> None:
        self._client = raw_client(url)
        self._every = every
        self.peak = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def __aenter__(self) -> ClientGauge:
        self._task = asyncio.get_running_loop().create_task(self._sample())
        return self

    async def _sample(self) -> None:
        while not self._stop.is_set():
            info = await self._client.info("clients")
            self.peak = max(self.peak, int(info.get("connected_clients", 0)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._every)

    async def __aexit__(self, *exc: object) -> None:
        # Told to stop, never cancelled: on Python 3.11 redis-py writes a command under
        # asyncio.wait_for, which swallows a cancel landing just after the write finished, and
        # the sampler then sampled forever while this exit waited for it (the bench hung).
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        await self._client.aclose()


class CommandTally:
    """Counts the commands Redis executes while open, split into commands clients sent (by
    name) and commands run inside Lua scripts, using MONITOR (slow: never open while timing)."""

    def __init__(self, url: str) -> None:
        self._client = raw_client(url)
        self.sent: dict[str, int] = {}
        self.scripts: dict[str, int] = {}
        self.in_scripts = 0
        self._names = script_names()
        self._marker = f"tally-end-{id(self)}"
        self._done: asyncio.Event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._monitor: Any = None

    async def __aenter__(self) -> CommandTally:
        self._monitor = self._client.monitor()
        await self._monitor.__aenter__()
        self._task = asyncio.get_running_loop().create_task(self._read())
        return self

    async def _read(self) -> None:
        while True:
            info = await self._monitor.next_command()
            command = str(info.get("command", ""))
            name = command.split(" ", 1)[0].lower()
            if name == "echo" and self._marker in command:
                self._done.set()
                return
            if info.get("client_type") == "lua":
                self.in_scripts += 1
            elif name != "hello":  # connection set-up, not protocol
                self.sent[name] = self.sent.get(name, 0) + 1
                if name in ("evalsha", "evalsha_ro"):
                    sha = command.split(" ", 2)[1].strip('"')
                    script = self._names.get(sha, sha[:12])
                    self.scripts[script] = self.scripts.get(script, 0) + 1

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self._client.echo(self._marker)
            await asyncio.wait_for(self._done.wait(), 10.0)
        finally:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
            with contextlib.suppress(Exception):
                await self._monitor.__aexit__(None, None, None)
            await self._client.aclose()

    def per_turn(self, turns: int) -> dict[str, Any]:
        """Commands per turn: sent by clients (by name, total), scripts sent (by script name,
        most first) and commands run inside scripts."""
        sent = {name: round(count / turns, 2) for name, count in sorted(self.sent.items())}
        ranked = sorted(self.scripts.items(), key=lambda item: -item[1])
        return {
            "sent": sent,
            "sent_total": round(sum(self.sent.values()) / turns, 2),
            "scripts": {name: round(count / turns, 2) for name, count in ranked},
            "in_scripts": round(self.in_scripts / turns, 2),
        }


class LogCounter:
    """Counts (and keeps off the console) what stickless logs at WARNING or above while open:
    a flood of identical warnings is summarized in the results instead."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._logger = logging.getLogger("stickless")
        self._handler = _CountingHandler(self.counts)
        self._propagate = True

    def __enter__(self) -> LogCounter:
        self._propagate = self._logger.propagate
        self._logger.propagate = False
        self._logger.addHandler(self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self._handler)
        self._logger.propagate = self._propagate


class _CountingHandler(logging.Handler):
    def __init__(self, counts: dict[str, int]) -> None:
        super().__init__(logging.WARNING)
        self._counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        key = f"{record.levelname} {record.name}: {record.getMessage()[:120]}"
        self._counts[key] = self._counts.get(key, 0) + 1
