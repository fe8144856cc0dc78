"""HTTP pieces of the `http` scenario: `stickless serve` processes, a haproxy round-robin load
balancer in front of them, and a minimal asyncio HTTP/1.1 client (keep-alive, chunked bodies,
server-sent events), all on 127.0.0.1.

The client is deliberately small: what it measures is the gateway and the balancer, not a
client library's own overhead. Every process is started through the run's `Processes` and
stopped by its pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..local_services import free_port
from ._procs import START_TIMEOUT, Processes, read_line

#: The bench agent, loaded by every serve process.
SERVE_OPENER = "stickless.bench.agent:make_opener"
#: Response header haproxy sets to the name of the server that answered.
SERVED_BY = "x-served-by"


def haproxy_executable() -> str:
    """The haproxy binary (PATH, then /usr/sbin and /sbin).

    Raises:
        RuntimeError: haproxy is not installed.
    """
    found = shutil.which("haproxy", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError(
            "the http scenario needs haproxy (apt-get install -y haproxy) in front of its "
            "serve processes"
        )
    return found


# ====================================================================== processes


def _spawn_logged(
    processes: Processes, args: list[str], log_path: Path, *, stdout: bool
) -> subprocess.Popen[bytes]:
    """Start `args` with stderr (and `stdout`, else a pipe) appended to `log_path`."""
    with open(log_path, "ab") as log:
        return processes.spawn(args, stdout=log if stdout else subprocess.PIPE, stderr=log)


class ServeProc:
    """One `stickless serve` process over the run's Redis, running the bench agent."""

    def __init__(
        self,
        processes: Processes,
        name: str,
        redis_url: str,
        namespace: str,
        config: dict[str, Any],
        log_dir: Path,
    ) -> None:
        self._processes = processes
        self.name = name
        self.redis_url = redis_url
        self.namespace = namespace
        self.config = config
        self.log_path = log_dir / f"{name}.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        #: The router's node id (with its incarnation), from the READY line.
        self.node_id = ""

    async def start(self) -> ServeProc:
        """Start and wait for READY (bounded).

        Raises:
            RuntimeError: it exited or printed no READY line in time.
        """
        args = [
            sys.executable, "-m", "stickless", "serve",
            "--redis", self.redis_url,
            "--namespace", self.namespace,
            "--opener", SERVE_OPENER,
            "--port", str(self.port),
            "--node-id", self.name,
            "--grace", "1",
            "--config", json.dumps(self.config),
        ]  # fmt: skip
        self.process = _spawn_logged(self._processes, args, self.log_path, stdout=False)
        assert self.process.stdout is not None
        try:
            line = await read_line(self.process.stdout, START_TIMEOUT, self.name)
            if not line.startswith("READY "):
                raise RuntimeError(f"{self.name} did not start ({line!r}); see {self.log_path}")
            self.node_id = line.split()[2]
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        """Graceful stop by pid (SIGTERM; SIGKILL past the bound)."""
        if self.process is not None:
            await asyncio.to_thread(self._processes.stop, self.process)


class Balancer:
    """haproxy on loopback: round robin over the serve processes, no stickiness, each answer
    stamped with the name of the server that gave it (`X-Served-By`)."""

    def __init__(self, processes: Processes, nodes: list[ServeProc], log_dir: Path) -> None:
        self._processes = processes
        self.nodes = nodes
        self.port = free_port()
        self.config_path = log_dir / "haproxy.cfg"
        self.log_path = log_dir / "haproxy.log"
        self.process: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        servers = "\n".join(
            f"    server {n.name} 127.0.0.1:{n.port} check inter 1s" for n in self.nodes
        )
        return f"""global
    maxconn 512
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    option http-server-close
    option http-no-delay
frontend web
    bind 127.0.0.1:{self.port}
    default_backend nodes
backend nodes
    balance roundrobin
    option httpchk GET /readyz
    http-response set-header X-Served-By %s
{servers}
"""

    async def start(self) -> Balancer:
        """Start and wait until every node has answered through it (bounded).

        Raises:
            RuntimeError: haproxy is missing, exited, or did not serve every node in time.
        """
        executable = haproxy_executable()
        self.config_path.write_text(self.config(), encoding="utf-8")
        args = [executable, "-db", "-f", str(self.config_path)]
        self.process = _spawn_logged(self._processes, args, self.log_path, stdout=True)
        try:
            await self._wait_serving()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _wait_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        seen: set[str] = set()
        while len(seen) < len(self.nodes):
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"haproxy served only {sorted(seen)}; see {self.log_path}")
            with contextlib.suppress(OSError, ValueError, asyncio.IncompleteReadError):
                async with HttpClient(self.port) as client:
                    answer = await client.request("GET", "/healthz")
                    if answer.status == 200:
                        seen.add(answer.headers.get(SERVED_BY, ""))
                    continue
            await asyncio.sleep(0.1)  # not listening yet: a process we only poll

    async def stop(self) -> None:
        if self.process is not None:
            await asyncio.to_thread(self._processes.stop, self.process)


# ====================================================================== client


@dataclass
class Answer:
    """A whole (non-streamed) response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class SseEvent:
    """One server-sent event: its `event:` name, its `data:` text and when it was parsed."""

    name: str
    data: str
    received_ns: int


@dataclass
class SseStream:
    """A streamed response: status, headers, then its events (`events()`)."""

    status: int
    headers: dict[str, str]
    _chunks: AsyncIterator[bytes] = field(repr=False)

    async def events(self) -> AsyncGenerator[SseEvent, None]:
        """The events, each stamped with `time.time_ns()` as soon as its chunk is parsed."""
        buffer = b""
        async for chunk in self._chunks:
            received = time.time_ns()
            buffer += chunk
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                name, data = "message", []
                for line in block.decode().split("\n"):
                    if line.startswith("event:"):
                        name = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip())
                if data:
                    yield SseEvent(name, "\n".join(data), received)

    async def drain(self) -> None:
        """Read the body to its end (the connection is reusable after)."""
        async for _ in self._chunks:
            pass


class HttpClient:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1:`port`, reopened when the server closes
    it; one request at a time."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reusable = False

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _send(
        self, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], AsyncIterator[bytes]]:
        if self._writer is None or not self._reusable:
            await self.aclose()
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self._reader is not None and self._writer is not None
        payload = b"" if body is None else json.dumps(body).encode()
        head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        self._writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await self._writer.drain()
        status_line = await self._reader.readline()
        if not status_line:
            raise ConnectionResetError("connection closed before the response")
        status = int(status_line.split()[1])
        answer_headers: dict[str, str] = {}
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode().partition(":")
            answer_headers[name.strip().lower()] = value.strip()
        self._reusable = answer_headers.get("connection", "").lower() != "close"
        return status, answer_headers, self._body(answer_headers)

    async def _body(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        reader = self._reader
        assert reader is not None
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";")[0].strip(), 16)
                if size == 0:
                    await reader.readline()  # the blank line after the last chunk
                    return
                chunk = await reader.readexactly(size)
                await reader.readexactly(2)
                yield chunk
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if length:
                yield await reader.readexactly(length)
        else:  # delimited by the close
            self._reusable = False
            while chunk := await reader.read(65536):
                yield chunk

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Answer:
        status, answer_headers, chunks = await self._send(method, path, body, headers or {})
        data = b"".join([chunk async for chunk in chunks])
        return Answer(status, answer_headers, data)

    async def stream(self, method: str, path: str, body: Any = None) -> SseStream:
        """A request with `Accept: text/event-stream`; read its `events()` (then `drain()`)."""
        status, headers, chunks = await self._send(
            method, path, body, {"Accept": "text/event-stream"}
        )
        return SseStream(status, headers, chunks)
