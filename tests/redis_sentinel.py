"""A private replicated Redis watched by Sentinels: one primary, two replicas and three
Sentinels (quorum 2), each a `redis-server` process on a free loopback port, stopped by its
pid. `failover_after_kill()` SIGKILLs the primary and waits until the Sentinels name a new one."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stickless.local_services import RedisServer, free_port

from .redis_fixture import redis_executable

#: The service name the Sentinels monitor.
SERVICE = "stickless-primary"
#: Milliseconds without an answer after which a Sentinel deems the primary down.
DOWN_AFTER_MS = 1000
#: Bound of a failover (seconds): detection, election and promotion, on a busy machine.
FAILOVER_TIMEOUT = 45.0


class SentinelSet:
    """The servers and Sentinels of one monitored service."""

    def __init__(self, directory: Path) -> None:
        executable = redis_executable()
        self.directory = directory
        self.servers: list[RedisServer] = []
        primary_port = free_port()
        for index in range(3):
            follow = [] if index == 0 else ["--replicaof", "127.0.0.1", str(primary_port)]
            self.servers.append(
                RedisServer(
                    directory / f"redis-{index}",
                    port=primary_port if index == 0 else None,
                    executable=executable,
                    extra_args=follow,
                )
            )
        self.sentinels: list[RedisServer] = []
        for index in range(3):
            home = directory / f"sentinel-{index}"
            home.mkdir(parents=True)
            conf = home / "sentinel.conf"
            conf.write_text(
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                f"sentinel parallel-syncs {SERVICE} 2\n"
            )
            self.sentinels.append(
                RedisServer(
                    home, executable=executable, extra_args=["--sentinel"], config_file=conf
                )
            )

    @property
    def url(self) -> str:
        """The `redis+sentinel://` URL of the service."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def primary_port(self) -> int:
        """The port the Sentinels name as the primary now."""
        return _sentinel_master(self.sentinels[0].port)

    def primary(self) -> RedisServer:
        port = self.primary_port()
        return next(s for s in self.servers if s.port == port)

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self.wait_replicas(2)
        for sentinel in self.sentinels:
            sentinel.start()
        self._wait_sentinels_agree(self.servers[0].port, replicas=2)

    def stop(self) -> None:
        for process in [*self.sentinels, *self.servers]:
            process.stop()

    def wait_replicas(self, count: int) -> None:
        """Until the primary has `count` replicas online."""
        port = self.primary_port() if self.sentinels[0].running else self.servers[0].port
        deadline = time.monotonic() + FAILOVER_TIMEOUT
        while _connected_replicas(port) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"the primary on {port} has not {count} replicas in time")
            time.sleep(0.05)

    def _wait_sentinels_agree(self, port: int, replicas: int) -> None:
        deadline = time.monotonic() + FAILOVER_TIMEOUT
        while True:
            seen = [_sentinel_view(s.port) for s in self.sentinels]
            if all(v == (port, replicas, len(self.sentinels) - 1) for v in seen):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the Sentinels do not agree in time: {seen}")
            time.sleep(0.05)

    def failover_after_kill(self) -> RedisServer:
        """SIGKILL the primary; the replica the Sentinels promote, once every Sentinel names it."""
        old = self.primary()
        old.kill()
        deadline = time.monotonic() + FAILOVER_TIMEOUT
        while True:
            ports = {_sentinel_master(s.port) for s in self.sentinels}
            if len(ports) == 1 and old.port not in ports:
                promoted = next(s for s in self.servers if s.port in ports)
                if _role(promoted.port) == "master":
                    return promoted
            if time.monotonic() > deadline:
                raise AssertionError("the Sentinels promoted no replica in time")
            time.sleep(0.05)


@contextlib.contextmanager
def _client(port: int) -> Iterator[redis.Redis]:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def _sentinel_master(port: int) -> int:
    """The primary's port as the Sentinel on `port` names it."""
    with _client(port) as client:
        return int(client.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)[1])


def _sentinel_view(port: int) -> tuple[int, int, int]:
    """(primary port, replicas known, other Sentinels known) of the Sentinel on `port`."""
    with _client(port) as client:
        fields = client.execute_command("SENTINEL", "MASTER", SERVICE)  # parsed to a dict
    return int(fields["port"]), int(fields["num-slaves"]), int(fields["num-other-sentinels"])


def _connected_replicas(port: int) -> int:
    with _client(port) as client:
        info = client.info("replication")
    return sum(
        1
        for key, value in info.items()
        if key.startswith("slave") and isinstance(value, dict) and value["state"] == "online"
    )


def _role(port: int) -> str:
    with _client(port) as client:
        return str(client.execute_command("ROLE")[0])


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    """A fresh primary, two replicas and three Sentinels for one test."""
    running = SentinelSet(tmp_path)
    try:
        running.start()
        yield running
    finally:
        running.stop()
