"""A private `redis-server` for tests: started on a free loopback port, never the shared 6379.

`RedisServer` is reusable by multi-process and restart tests (same directory and port across
`restart()`, optional append-only persistence). The session fixture `redis_server` starts one;
`redis_url` flushes it before each test. Without `redis-server` on PATH the fixtures skip the
test, except under `CI=true` where they fail it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: How long a starting server may take to answer PING.
START_TIMEOUT = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _encode(*args: str) -> bytes:
    """One command in the Redis protocol."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def command(port: int, *args: str, password: str | None = None, timeout: float = 2.0) -> bytes:
    """Send one command over a raw socket (after AUTH when a password is given) and return its
    one-line reply, so the fixture needs no client library."""
    requests = ([_encode("AUTH", password)] if password else []) + [_encode(*args)]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(b"".join(requests))
        received = b""
        while received.count(b"\r\n") < len(requests):
            chunk = conn.recv(4096)
            if not chunk:
                break
            received += chunk
    return received.split(b"\r\n")[len(requests) - 1]


class RedisServer:
    """One `redis-server` process bound to 127.0.0.1 in its own directory."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        appendonly: bool = False,
        password: str | None = None,
        executable: str = "redis-server",
    ) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.appendonly = appendonly
        self.password = password
        self.executable = executable
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL clients connect with (carrying the password, if any)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server (same directory and port as before) and wait until it answers PING.

        Raises:
            RuntimeError: it exited or did not answer within `START_TIMEOUT`.
        """
        if self.running:
            return
        if self.appendonly:
            persistence = ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            persistence = ["--appendonly", "no"]
        args = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            *persistence,
            "--dir", str(self.directory),
            "--logfile", str(self.directory / "redis.log"),
            *(["--requirepass", self.password] if self.password else []),
        ]  # fmt: skip
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._process.poll() is not None:
                self._process = None
                raise RuntimeError(f"redis-server exited at start; see {self.directory}/redis.log")
            try:
                if command(self.port, "PING", password=self.password) == b"+PONG":
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING within {START_TIMEOUT}s")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the server by its pid: terminate, wait, kill if it lingers."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def restart(self) -> None:
        """Stop and start again on the same port and directory."""
        self.stop()
        self.start()

    def flush(self) -> None:
        """Drop every key and every cached script."""
        command(self.port, "FLUSHALL", password=self.password)
        command(self.port, "SCRIPT", "FLUSH", password=self.password)


def redis_executable() -> str:
    """The `redis-server` on PATH; fails under CI=true and skips otherwise when it is missing."""
    found = shutil.which("redis-server")
    if found is not None:
        return found
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(
            "redis-server is not on PATH but CI=true requires the Redis tests: "
            "install it (apt-get install -y redis-server)"
        )
    pytest.skip("redis-server is not on PATH")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server for the whole test session."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), executable=redis_executable())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of the session's redis-server, running (restarted if a test stopped it) and empty."""
    redis_server.start()
    redis_server.flush()
    return redis_server.url
