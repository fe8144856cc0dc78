"""Child processes of a benchmark run: node processes and helpers (the run's private
redis-server is a `stickless.local_services.RedisServer`).

Every process is started here and stopped by its pid (SIGTERM, then SIGKILL when it lingers);
the registry stops whatever is left when the run ends, even after a failure. Everything listens
on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from ..local_services import package_root
from ..node import NodeClient

#: Bound of a child's start (imports, Redis connection, READY line).
START_TIMEOUT = 30.0
#: Bound of a graceful stop before the child is killed.
STOP_TIMEOUT = 10.0
#: The import path of the bench agent every node process runs.
BENCH_OPENER = "stickless.bench.agent:make_opener"


def child_env() -> dict[str, str]:
    """The environment of a Python child: this `stickless` importable, whatever the cwd."""
    paths = [package_root(), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


class Processes:
    """Every child started by one run, by pid; `stop_all` ends the ones still running."""

    def __init__(self) -> None:
        self._live: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(
        self,
        args: list[str],
        *,
        stdout: int | IO[Any] | None = subprocess.PIPE,
        stdin: int | None = None,
        stderr: IO[Any] | int | None = subprocess.DEVNULL,
    ) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            args, stdin=stdin, stdout=stdout, stderr=stderr, env=child_env(), close_fds=True
        )
        self._live[process.pid] = process
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL by pid (no-op when it already exited)."""
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)

    def reap(self, process: subprocess.Popen[bytes], within: float = STOP_TIMEOUT) -> bool:
        """Wait for the exit (bounded) and close its pipes; True when it exited."""
        try:
            process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            return False
        self._live.pop(process.pid, None)
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                with contextlib.suppress(Exception):
                    pipe.close()
        return True

    def stop(self, process: subprocess.Popen[bytes], within: float = STOP_TIMEOUT) -> None:
        """SIGTERM by pid, wait, SIGKILL when it lingers, reap."""
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        if not self.reap(process, within):
            self.kill(process)
            self.reap(process, within)

    def stop_all(self) -> None:
        for process in list(self._live.values()):
            self.stop(process, within=5.0)


async def read_line(stream: IO[bytes], within: float, what: str) -> str:
    """One line from a child's stdout, bounded.

    Raises:
        RuntimeError: nothing within `within` seconds, or the pipe closed.
    """
    try:
        line = await asyncio.wait_for(asyncio.to_thread(stream.readline), within)
    except TimeoutError:
        raise RuntimeError(f"{what}: no answer within {within:.0f}s") from None
    if not line:
        raise RuntimeError(f"{what}: exited")
    return line.decode(errors="replace").strip()


class NodeProc:
    """One `stickless node` process running the bench agent, and a client connected to it."""

    def __init__(
        self,
        processes: Processes,
        node_id: str,
        redis_url: str,
        namespace: str,
        config: dict[str, Any],
        log_dir: Path,
    ) -> None:
        self._processes = processes
        self.node_id = node_id
        self.redis_url = redis_url
        self.namespace = namespace
        self.config = config
        self.log_path = log_dir / f"{node_id}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._client: NodeClient | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def client(self) -> NodeClient:
        assert self._client is not None, f"{self.node_id} is not started"
        return self._client

    async def start(self) -> NodeProc:
        """Start, wait for READY (bounded) and connect.

        Raises:
            RuntimeError: it exited or printed no READY line in time.
        """
        args = [
            sys.executable, "-m", "stickless", "node",
            "--redis", self.redis_url,
            "--node-id", self.node_id,
            "--opener", BENCH_OPENER,
            "--namespace", self.namespace,
            "--port", "0",
            "--grace", "1",
            "--config", json.dumps(self.config),
        ]  # fmt: skip
        self.process = self._spawn(args)
        assert self.process.stdout is not None
        try:
            line = await read_line(self.process.stdout, START_TIMEOUT, self.node_id)
            if not line.startswith("READY "):
                raise RuntimeError(f"{self.node_id} did not start ({line!r}); see {self.log_path}")
            fields = line.split()
            self._client = await NodeClient.connect(int(fields[1]))
            self.node_id = fields[2]  # the id with this process's incarnation
        except BaseException:
            await self.kill()
            raise
        return self

    def _spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            return self._processes.spawn(args, stderr=log)

    async def kill(self) -> None:
        """SIGKILL by pid and reap (a crash: no release, no announcement)."""
        if self.process is not None:
            self._processes.kill(self.process)
            await asyncio.to_thread(self._processes.reap, self.process)
        await self._close_client()

    async def stop(self) -> None:
        """Graceful stop by pid (SIGTERM; SIGKILL past the bound)."""
        await self._close_client()
        if self.process is not None:
            await asyncio.to_thread(self._processes.stop, self.process)

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(), 5)
