"""Node processes for the multi-process tests: `stickless node` started as real OS processes.

`NodeProcess` runs ``python -m stickless node`` with the agent of `tests.mp_agent`, waits for its
``READY <port>`` line (bounded) and connects a `NodeClient`; it can be SIGKILLed, SIGSTOPped,
SIGCONTed or terminated gracefully. `MpCluster` starts N of them over one Redis URL and namespace
with short RouterConfig timings, starts replacements with fresh node ids, and at exit stops every
process it started by its pid (SIGTERM, then SIGKILL when it lingers). An `atexit` hook kills
whatever a crashed test run left behind, again only by the pids started here.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from stickless.backends.redis import RedisBackends
from stickless.node import NodeClient

from .mp_agent import ENV_NODE, ENV_REDIS, gate_key, log_key

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Bound of a node process's start (imports, Redis connection, READY line).
START_TIMEOUT = 30.0
#: Bound of a graceful stop before the process is killed.
STOP_TIMEOUT = 10.0
#: Short timings: every failure path resolves within a couple of seconds.
FAST_CONFIG: dict[str, Any] = dict(
    # Node ids here are unique per process: keep them readable (a restart reuses its id).
    node_incarnation=False,
    lease_ttl=1.5,
    lease_extend_interval=0.4,
    idempotency_secondary_ttl=1.0,
    holder_loss_sweep_interval=0.3,
    forward_ttl=20.0,
    release_interrupt_timeout=1.5,
    interrupt_grace=0.3,
    status_heartbeat_interval=0.5,
)

#: On Linux a node process is started through this launcher: it asks the kernel to SIGKILL it
#: when the test process dies (PR_SET_PDEATHSIG, kept across exec), then execs the node, so the
#: pid stays the same and even a test run killed with SIGKILL leaves no node behind.
_LAUNCHER = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)

#: Every test process (node, serve, haproxy) not reaped yet (pid -> Popen); SIGKILLed at exit.
LIVE_PROCESSES: dict[int, subprocess.Popen[bytes]] = {}


@atexit.register
def _reap_leftovers() -> None:
    for pid, process in list(LIVE_PROCESSES.items()):
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                process.wait(timeout=5)
        LIVE_PROCESSES.pop(pid, None)


class NodeProcess:
    """One `stickless node` OS process and a client connected to it."""

    def __init__(
        self,
        node_id: str,
        redis_url: str,
        namespace: str,
        config: dict[str, Any],
        log_dir: Path,
        opener: str = "tests.mp_agent:make_opener",
        grace: float = 2.0,
        log_url: str | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self.node_id = node_id
        self.redis_url = redis_url
        #: The server of the agent's turn log and gates (default: the node's own `redis_url`).
        self.log_url = log_url or redis_url
        self.namespace = namespace
        self.config = config
        self.log_path = log_dir / f"{node_id.replace('/', '_')}.log"
        self.opener = opener
        self.grace = grace
        #: Where the node serves its Prometheus metrics (`--metrics-port`; None: it does not).
        self.metrics_port = metrics_port
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._client: NodeClient | None = None
        #: Set once the process was SIGKILLed (its callers may get RouterClosedError).
        self.killed = False
        self.stopped = False

    def __repr__(self) -> str:
        return f"NodeProcess({self.node_id}, pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def client(self) -> NodeClient:
        assert self._client is not None, f"{self.node_id} is not started"
        return self._client

    async def start(self) -> None:
        """Start the process, wait for its READY line (bounded) and connect a client.

        Raises:
            RuntimeError: the process exited or did not print READY within START_TIMEOUT.
        """
        env = {
            **os.environ,
            ENV_REDIS: self.log_url,
            ENV_NODE: self.node_id,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        launch = [sys.executable, "-c", _LAUNCHER] if sys.platform == "linux" else [sys.executable]
        args = [
            *launch, "-m", "stickless", "node",
            "--redis", self.redis_url,
            "--node-id", self.node_id,
            "--opener", self.opener,
            "--namespace", self.namespace,
            "--port", "0",
            "--grace", str(self.grace),
            "--config", json.dumps(self.config),
        ]  # fmt: skip
        if self.metrics_port is not None:
            args += ["--metrics-port", str(self.metrics_port)]
        self.process = self._spawn(args, env)
        stdout = self.process.stdout
        assert stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(stdout.readline), START_TIMEOUT)
        except TimeoutError:
            await self.sigkill()
            raise RuntimeError(
                f"{self.node_id} printed no READY line within {START_TIMEOUT}s"
            ) from None
        text = line.decode(errors="replace").strip()
        if not text.startswith("READY "):
            await self.sigkill()
            raise RuntimeError(f"{self.node_id} did not start ({text!r}); see {self.log_path}")
        self.port = int(text.split()[1])
        self._client = await NodeClient.connect(self.port)

    def _spawn(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start the process (stderr appended to its log file) and register its pid.

        Called on the event loop's thread, which lives as long as the test: the launcher's
        parent-death signal follows the thread that started the process.
        """
        with open(self.log_path, "ab") as stderr:
            process = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=REPO_ROOT
            )
        LIVE_PROCESSES[process.pid] = process
        return process

    def _signal(self, signum: int) -> None:
        if self.alive:
            assert self.pid is not None
            os.kill(self.pid, signum)

    def sigstop(self) -> None:
        self._signal(signal.SIGSTOP)
        self.stopped = True

    def sigcont(self) -> None:
        self._signal(signal.SIGCONT)
        self.stopped = False

    async def sigkill(self) -> None:
        """SIGKILL the process and reap it; its client's pending calls fail."""
        self.killed = True
        self._signal(signal.SIGKILL)
        await self._reap(STOP_TIMEOUT)
        await self._close_client()

    async def terminate(self, within: float = STOP_TIMEOUT) -> bool:
        """Graceful stop (SIGTERM, SIGCONT if it was stopped); SIGKILL past `within` seconds.

        Returns True when it exited by itself.
        """
        graceful = True
        if self.alive:
            self._signal(signal.SIGTERM)
            if self.stopped:
                self.sigcont()
            if not await self._reap(within):
                graceful = False
                self._signal(signal.SIGKILL)
                await self._reap(STOP_TIMEOUT)
        else:
            await self._reap(STOP_TIMEOUT)
        await self._close_client()
        return graceful

    async def _reap(self, within: float) -> bool:
        process = self.process
        if process is None:
            return True
        try:
            await asyncio.wait_for(asyncio.to_thread(process.wait), within)
        except TimeoutError:
            return False
        LIVE_PROCESSES.pop(process.pid, None)
        if process.stdout is not None:
            process.stdout.close()
        return True

    async def _close_client(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._client.aclose(), 5)


class MpCluster:
    """N node processes over one Redis URL and namespace (an async context manager)."""

    def __init__(
        self,
        redis_url: str,
        log_dir: Path,
        *,
        nodes: int = 3,
        namespace: str | None = None,
        grace: float = 2.0,
        node_url: Callable[[str], str] | None = None,
        **config: Any,
    ) -> None:
        """`node_url(node_id)`: the Redis URL a new node process connects to (default
        `redis_url`, e.g. a fault proxy of its own); the agent's log and the test's own
        clients always use `redis_url`."""
        self.redis_url = redis_url
        self.node_url = node_url
        self.log_dir = log_dir
        self.size = nodes
        self.namespace = namespace or f"mp{uuid.uuid4().hex[:8]}"
        self.grace = grace
        self.config = {**FAST_CONFIG, **config}
        self.nodes: list[NodeProcess] = []
        self._incarnations = 0
        self._backends: RedisBackends | None = None
        self._redis: redis.asyncio.Redis | None = None

    async def __aenter__(self) -> MpCluster:
        try:
            await asyncio.gather(*(self.add_node() for _ in range(self.size)))
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def alive(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.alive and not n.killed]

    def node(self, node_id: str) -> NodeProcess:
        return next(n for n in self.nodes if n.node_id == node_id)

    async def add_node(self) -> NodeProcess:
        """Start one more node process under a fresh node id."""
        self._incarnations += 1
        node_id = f"node-{self._incarnations}"
        node = NodeProcess(
            node_id,
            self.node_url(node_id) if self.node_url is not None else self.redis_url,
            self.namespace,
            self.config,
            self.log_dir,
            grace=self.grace,
            log_url=self.redis_url,
        )
        self.nodes.append(node)
        await node.start()
        return node

    @property
    def backends(self) -> RedisBackends:
        """A bundle over the cluster's namespace, for the test to inspect the stores."""
        if self._backends is None:
            self._backends = RedisBackends.from_url(self.redis_url, namespace=self.namespace)
        return self._backends

    @property
    def redis(self) -> redis.asyncio.Redis:
        """A plain client for gates, the agent's log and the server clock."""
        if self._redis is None:
            # (a pooled connection may have outlived a server restart: retry on a fresh one)
            self._redis = redis.asyncio.Redis.from_url(
                self.redis_url,
                socket_timeout=5.0,
                retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 5),
                retry_on_error=[redis.ConnectionError, redis.TimeoutError],
            )
        return self._redis

    async def server_time(self) -> int:
        """The Redis server's clock in microseconds (the agent's log uses the same clock)."""
        seconds, micros = await self.redis.time()
        return int(seconds) * 1_000_000 + int(micros)

    async def open_gate(self, name: str) -> None:
        await self.redis.set(gate_key(name), "1")

    async def log_entries(self, session_id: str) -> list[LogEntry]:
        raw = await self.redis.lrange(log_key(session_id), 0, -1)
        return [LogEntry.parse(item.decode()) for item in raw]

    async def started(self, session_id: str, turn_id: str, within: float = 15.0) -> LogEntry:
        """The agent's start entry of the turn (polled, bounded)."""

        async def find() -> LogEntry | None:
            for entry in await self.log_entries(session_id):
                if entry.ev == "start" and entry.turn_id == turn_id:
                    return entry
            return None

        return await poll(find, within, f"turn {turn_id} of {session_id} never started")

    async def ended(self, session_id: str, turn_id: str, within: float = 15.0) -> LogEntry:
        """The agent's end entry of the turn (polled, bounded)."""

        async def find() -> LogEntry | None:
            for entry in await self.log_entries(session_id):
                if entry.ev == "end" and entry.turn_id == turn_id:
                    return entry
            return None

        return await poll(find, within, f"turn {turn_id} of {session_id} never ended")

    async def aclose(self) -> None:
        """Stop every node process this cluster started (by pid), then close the clients."""
        await asyncio.gather(*(n.terminate() for n in self.nodes), return_exceptions=True)
        if self._backends is not None:
            with contextlib.suppress(Exception):
                await self._backends.aclose()
            self._backends = None
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
            self._redis = None


class LogEntry:
    """One line of the agent's turn log (see tests.mp_agent); `stamp` in server microseconds."""

    __slots__ = ("ev", "how", "node", "stamp", "text", "turn_id")

    def __init__(self, ev: str, turn_id: str, node: str, how: str, stamp: int, text: str):
        self.ev = ev
        self.turn_id = turn_id
        self.node = node
        self.how = how
        self.stamp = stamp
        self.text = text

    @classmethod
    def parse(cls, raw: str) -> LogEntry:
        ev, turn_id, node, how, stamp, text = raw.split("|", 5)
        seconds, _, micros = stamp.partition(".")
        return cls(ev, turn_id, node, how, int(seconds) * 1_000_000 + int(micros), text)

    def __repr__(self) -> str:
        return f"{self.ev}({self.turn_id[:8]} on {self.node} {self.how} @{self.stamp})"


async def poll(
    probe: Callable[[], Awaitable[T | None]], within: float, message: str, every: float = 0.02
) -> T:
    """Poll `probe` until it returns something other than None/False (bounded by `within`)."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} (within {within}s)")
        await asyncio.sleep(every)
