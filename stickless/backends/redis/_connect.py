"""How a bundle reaches its server: straight from a `redis://` URL, or through Redis Sentinel
(`redis+sentinel://`), whose pools ask the Sentinels for the primary on every new connection,
so after a failover every connection (commands, pub/sub, the renewer's own) follows it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

#: The scheme of a Sentinel URL.
SENTINEL_SCHEME = "redis+sentinel://"
#: A Sentinel's port when the URL names none.
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a `redis+sentinel://` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    username: str | None = None
    password: str | None = None
    db: int = 0


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def sentinel_url(sentinels: str, service: str) -> str:
    """The URL of `--redis-sentinel h1:p1,h2:p2 --redis-service NAME`."""
    return f"{SENTINEL_SCHEME}{sentinels}/{service}"


def _address(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon:
        host, port = text, str(DEFAULT_SENTINEL_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Sentinel address {text!r} is not host:port")
    return host, int(port)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """`redis+sentinel://[user[:password]@]h1:p1[,h2:p2...]/service[?db=N]` as its parts.

    Raises:
        ValueError: the URL names no Sentinel, no service, or a bad port or db.
    """
    if not is_sentinel_url(url):
        raise ValueError(f"a Sentinel URL starts with {SENTINEL_SCHEME}")
    rest, _, query = url[len(SENTINEL_SCHEME) :].partition("?")
    credentials, at, hosts_and_path = rest.rpartition("@")
    hosts, _, service = hosts_and_path.partition("/")
    if not hosts:
        raise ValueError("a Sentinel URL names at least one Sentinel host:port")
    if not service or "/" in service:
        raise ValueError("a Sentinel URL ends with /service_name (the name Sentinel monitors)")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    db_values = parse_qs(query).get("db", ["0"])
    if len(db_values) != 1 or not db_values[0].isdigit():
        raise ValueError("db in a Sentinel URL is a non-negative integer")
    sentinels = tuple(_address(h) for h in hosts.split(","))
    return SentinelTarget(sentinels, unquote(service), username, password, int(db_values[0]))


class AnsweringPool(BlockingConnectionPool):
    """A blocking pool that tells `answered` each time a connection comes back still connected:
    its command got the server's answer (redis-py drops a connection whose call failed on the
    way, before it is released), so the node's command path works however busy the pool is."""

    answered: Callable[[], None] | None = None

    async def release(self, connection: AbstractConnection) -> None:
        if self.answered is not None and connection.is_connected:
            self.answered()
        await super().release(connection)


class BlockingSentinelPool(SentinelConnectionPool, AnsweringPool):
    """A Sentinel pool whose callers wait for a free connection, like the direct bundle's."""


@dataclass
class Connections:
    """A bundle's command pool, its pub/sub client, and the Sentinel client behind them."""

    pool: AnsweringPool
    pubsub: Redis
    sentinel: Sentinel | None = None

    async def close_sentinels(self) -> None:
        """Close the connections to the Sentinels (the pool and pub/sub close with their users)."""
        if self.sentinel is not None:
            for client in self.sentinel.sentinels:
                await client.aclose()


def connect(
    url: str, pool_options: dict[str, Any], pubsub_options: dict[str, Any]
) -> Connections:
    """The pools of a bundle over `url` (direct or through Sentinel); connections come lazily.

    `pool_options` holds `max_connections` and `timeout` (the wait for a free connection) and
    the connection keywords; `pubsub_options` the connection keywords of the pub/sub client.
    """
    if not is_sentinel_url(url):
        pool = AnsweringPool.from_url(url, **pool_options)
        return Connections(pool, Redis.from_url(url, **pubsub_options))
    target = parse_sentinel_url(url)
    auth = {"username": target.username, "password": target.password, "db": target.db}
    sentinel_options = {k: v for k, v in pubsub_options.items() if k.startswith("socket_")}
    # redis-py's Sentinel classes are untyped.
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call]
    pool = BlockingSentinelPool(target.service, sentinel, **auth, **pool_options)  # type: ignore[no-untyped-call]
    pubsub_pool = SentinelConnectionPool(target.service, sentinel, **auth, **pubsub_options)  # type: ignore[no-untyped-call]
    return Connections(pool, Redis(connection_pool=pubsub_pool), sentinel)
