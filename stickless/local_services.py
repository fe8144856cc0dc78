"""Local services on 127.0.0.1 for the demo, the benchmarks and the tests.

- `free_port()`: a loopback TCP port nothing listens on right now;
- `RedisServer`: a private `redis-server` on a free loopback port (never the machine's shared
  6379) in its own directory, optionally append-only or password protected; started, stopped,
  killed and restarted by its pid (a restart keeps the port and the directory);
- `private_redis()`: a `RedisServer` in a temporary directory, removed afterwards;
- `local_ray_cluster()`: a multi-node Ray cluster on loopback (`ray.cluster_utils.Cluster`) with
  the driver connected, shut down on exit.

Nothing here needs a Redis client library (the server is probed with raw protocol commands);
Ray is imported only by `local_ray_cluster`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"

#: Keep Ray on 127.0.0.1 (else it advertises the machine's external address) and do not report
#: usage. Ray reads these when it is first imported.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}

#: How long a starting redis-server may take to answer PING, by default.
REDIS_START_TIMEOUT = 10.0
#: How long a stopping redis-server may take to exit after SIGTERM before it is killed.
REDIS_STOP_TIMEOUT = 5.0


class ServiceError(RuntimeError):
    """A local service did not start (it exited, did not answer, or cannot run here)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def package_root() -> str:
    """The directory `stickless` is imported from (for a child's PYTHONPATH)."""
    import stickless

    return str(Path(stickless.__file__).resolve().parents[1])


# ====================================================================== redis-server


def _encode(*args: str) -> bytes:
    """One command in the Redis protocol."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def redis_command(
    port: int, *args: str, password: str | None = None, timeout: float = 2.0
) -> bytes:
    """Send one command to the loopback server on `port` over a raw socket (after AUTH when a
    password is given) and return its one-line reply."""
    requests = ([_encode("AUTH", password)] if password else []) + [_encode(*args)]
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as conn:
        conn.sendall(b"".join(requests))
        received = b""
        while received.count(b"\r\n") < len(requests):
            chunk = conn.recv(4096)
            if not chunk:
                break
            received += chunk
    return received.split(b"\r\n")[len(requests) - 1]


def find_redis_server(executable: str | None = None) -> str | None:
    """The full path of `executable` (default: `redis-server` on PATH), or None."""
    return shutil.which(executable or "redis-server")


class RedisServer:
    """One `redis-server` process bound to 127.0.0.1 in its own directory.

    `appendonly=True` persists every write (append-only file, fsync always) so the data survives
    `restart()`; otherwise nothing is persisted. With `password` the server requires AUTH and
    `url` carries it.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        port: int | None = None,
        appendonly: bool = False,
        password: str | None = None,
        executable: str = "redis-server",
        start_timeout: float = REDIS_START_TIMEOUT,
        stop_timeout: float = REDIS_STOP_TIMEOUT,
        extra_args: Sequence[str] = (),
        config_file: Path | None = None,
    ) -> None:
        self.directory = Path(directory)
        #: A configuration file read first (a Sentinel needs one it can rewrite).
        self.config_file = config_file
        #: Further configuration directives (`--tls-port`, `--user`, ...) after the defaults.
        self.extra_args = tuple(extra_args)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.password = password
        self.executable = executable
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL clients connect with (carrying the password, if any)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{LOOPBACK}:{self.port}/0"

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
            ServiceError: it exited or did not answer within `start_timeout`.
        """
        if self.running:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.appendonly:
            persistence = ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            persistence = ["--appendonly", "no"]
        args = [
            self.executable,
            *([str(self.config_file)] if self.config_file is not None else []),
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--save", "",
            *persistence,
            "--dir", str(self.directory),
            "--logfile", str(self.directory / "redis.log"),
            *(["--requirepass", self.password] if self.password else []),
            *self.extra_args,
        ]  # fmt: skip
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.poll() is not None:
                self._process = None
                raise ServiceError(f"redis-server exited at start; see {self.directory}/redis.log")
            try:
                if redis_command(self.port, "PING", password=self.password) == b"+PONG":
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceError(
                    f"redis-server did not answer PING within {self.start_timeout:.0f}s"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the server by its pid: SIGTERM, wait, SIGKILL if it lingers."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=self.stop_timeout)

    def kill(self) -> None:
        """Crash the server: SIGKILL by its pid (no shutdown, no final write), then reap it."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=self.stop_timeout)

    def restart(self) -> None:
        """Stop and start again on the same port and directory."""
        self.stop()
        self.start()

    def flush(self) -> None:
        """Drop every key and every cached script."""
        redis_command(self.port, "FLUSHALL", password=self.password)
        redis_command(self.port, "SCRIPT", "FLUSH", password=self.password)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def private_redis(
    executable: str = "redis-server", *, prefix: str = "stickless-redis-", **options: Any
) -> Iterator[RedisServer]:
    """A running `RedisServer` in a new temporary directory; stopped by its pid and the
    directory removed on exit. `options` are `RedisServer`'s (appendonly, password, ...).

    Raises:
        ServiceError: the server did not start.
    """
    directory = tempfile.mkdtemp(prefix=prefix)
    try:
        with RedisServer(directory, executable=executable, **options) as server:
            yield server
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ====================================================================== Ray


def ray_loopback_env() -> None:
    """Keep Ray on loopback and quiet (`RAY_ENV`) unless the environment says otherwise; call
    before Ray is first imported."""
    for name, value in RAY_ENV.items():
        os.environ.setdefault(name, value)


@dataclass(frozen=True)
class LocalRay:
    """A running loopback Ray cluster: the `ray.cluster_utils.Cluster` and its node ids."""

    cluster: Any
    #: Ray node ids (hex), head first, in start order.
    node_ids: list[str]

    @property
    def address(self) -> str:
        return str(self.cluster.address)


@contextlib.contextmanager
def local_ray_cluster(
    nodes: int,
    *,
    python_path: Sequence[str] = (),
    logging_level: str | None = "WARNING",
) -> Iterator[LocalRay]:
    """Start `nodes` Ray nodes on 127.0.0.1 (one head; 1 CPU each) and connect the driver.

    Worker processes get this `stickless` (and `python_path`) on their PYTHONPATH, so actors
    can import openers by path. Ray's files, its "current cluster" pointer included, go to a
    private temporary directory (`RAY_TMPDIR`), so another Ray on the machine is left alone.
    On exit the driver disconnects and Ray stops every node process by its pid; PYTHONPATH
    and RAY_TMPDIR are restored and the directory removed.

    Raises:
        ServiceError: Ray is already initialized in this process.
    """
    ray_loopback_env()
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
        # Ray reads this flag when first imported; if that happened before it was set, the
        # nodes started from this process would advertise the machine's external address.
        ray_constants.ENABLE_RAY_CLUSTER = False
    if ray.is_initialized():
        raise ServiceError("Ray is already initialized in this process")
    previous = {name: os.environ.get(name) for name in ("PYTHONPATH", "RAY_TMPDIR")}
    paths = [package_root(), *python_path, *(os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    # Ray's session files and its "current cluster" pointer go to a directory of this cluster's
    # own, so another user's Ray on the machine (and its /tmp/ray/ray_current_cluster) is left
    # alone. A short path: Ray's Unix sockets live under it.
    private = tempfile.mkdtemp(prefix="slray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    os.environ["RAY_TMPDIR"] = private
    try:
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": LOOPBACK}
        )
        try:
            ids = [str(cluster.head_node.node_id)]
            for _ in range(nodes - 1):
                ids.append(str(cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK).node_id))
            cluster.wait_for_nodes()
            init: dict[str, Any] = {} if logging_level is None else {"logging_level": logging_level}
            ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, **init)
            yield LocalRay(cluster, ids)
        finally:
            ray.shutdown()
            cluster.shutdown()
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(private, ignore_errors=True)


__all__ = [
    "LOOPBACK",
    "RAY_ENV",
    "REDIS_START_TIMEOUT",
    "REDIS_STOP_TIMEOUT",
    "LocalRay",
    "RedisServer",
    "ServiceError",
    "find_redis_server",
    "free_port",
    "local_ray_cluster",
    "package_root",
    "private_redis",
    "ray_loopback_env",
    "redis_command",
]
