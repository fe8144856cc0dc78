"""The Redis backends bundle: every storage role over one redis-py asyncio client."""

from __future__ import annotations

from typing import Any, ClassVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from ..base import EventLog, IdempotencyStore, Inbox, LeaseStore, RecordStore, SignalBus
from ._keys import Keys
from ._scripts import Scripts
from ._signals import RedisSignalBus
from ._stores import (
    RedisEventLog,
    RedisIdempotencyStore,
    RedisInbox,
    RedisLeaseStore,
    RedisRecordStore,
)

#: Default bound (seconds) of connecting and of waiting for one reply.
DEFAULT_SOCKET_TIMEOUT = 5.0
#: Connections one bundle opens at most for commands (pub/sub has its own).
DEFAULT_MAX_CONNECTIONS = 64
#: Default bound (seconds) of waiting for a free pooled connection.
DEFAULT_POOL_TIMEOUT = 30.0


class RedisBackends:
    """Every storage role on one Redis server, keyed cluster-ready; one pool per bundle."""

    #: Shared across processes: DISTRIBUTED routers accept this bundle.
    distributed: ClassVar[bool] = True

    # Typed as the roles so the bundle satisfies `Backends`, whose attributes are invariant.
    leases: LeaseStore
    records: RecordStore
    inbox: Inbox
    signals: SignalBus
    idempotency: IdempotencyStore
    events: EventLog

    def __init__(
        self, url: str, namespace: str, event_log_max_len: int, client_options: dict[str, Any]
    ) -> None:
        """Open a client (connections are made lazily); prefer `from_url`."""
        if event_log_max_len < 1:
            raise ValueError("event_log_max_len must be at least 1")
        self._url = url
        self._namespace = namespace
        self._event_log_max_len = event_log_max_len
        self._client_options = client_options
        self.keys = Keys(namespace)
        # A blocking pool: callers past `max_connections` wait (up to `pool_timeout`) for a
        # free connection instead of failing at once with "Too many connections", so a burst
        # of work on a healthy server queues instead of turning into 503s or failed turns.
        pool_options = dict(client_options)
        max_connections = int(pool_options.pop("max_connections", DEFAULT_MAX_CONNECTIONS))
        pool_timeout = float(pool_options.pop("pool_timeout", DEFAULT_POOL_TIMEOUT))
        self._pool = BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=pool_timeout, **pool_options
        )
        self.client: Redis = Redis(connection_pool=self._pool)
        # The pub/sub connection never retries inside redis-py: its reader reconnects by itself.
        pubsub_client = Redis.from_url(
            url, **{**pool_options, "retry": Retry(NoBackoff(), 0, supported_errors=())}
        )
        scripts = Scripts(self.client)
        self.leases = RedisLeaseStore(self.client, scripts, self.keys)
        self.records = RedisRecordStore(self.client, scripts, self.keys)
        self.inbox = RedisInbox(self.client, scripts, self.keys)
        self._signals = RedisSignalBus(
            self.client,
            pubsub_client,
            self.keys,
            float(pool_options["socket_timeout"] or DEFAULT_SOCKET_TIMEOUT),
        )
        self.signals = self._signals
        self.idempotency = RedisIdempotencyStore(self.client, scripts, self.keys)
        self.events = RedisEventLog(self.client, scripts, self.keys, event_log_max_len)

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "stickless",
        *,
        event_log_max_len: int = 10_000,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
        **client_options: Any,
    ) -> RedisBackends:
        """A bundle over the server at `url` (`redis://`, `rediss://` with TLS options, `unix://`;
        a password in the URL is used), with keys prefixed by `namespace`.

        Every call fails within about `socket_timeout` when the server is unreachable (connect
        bounded by `socket_connect_timeout`, default the same). At most `max_connections`
        commands are in flight; more wait up to `pool_timeout` for a connection. A command is
        retried once, at once, when its connection turns out closed (a pooled connection that
        outlived a server restart, or one cut after the server ran the command): every script
        stickless sends is safe to run twice. A timeout is not retried. Pass `retry=` to change
        that; other keyword arguments go to `redis.asyncio.BlockingConnectionPool.from_url`.
        """
        if max_connections < 1 or pool_timeout <= 0:
            raise ValueError("max_connections must be >= 1 and pool_timeout > 0")
        options: dict[str, Any] = {
            "max_connections": max_connections,
            "pool_timeout": pool_timeout,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": (
                socket_timeout if socket_connect_timeout is None else socket_connect_timeout
            ),
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            **client_options,
        }
        return cls(url, namespace, event_log_max_len, options)

    @property
    def namespace(self) -> str:
        """The key prefix of this bundle."""
        return self._namespace

    def clone(self) -> RedisBackends:
        """A new bundle over the same server and namespace with its own connection pool."""
        return RedisBackends(
            self._url, self._namespace, self._event_log_max_len, dict(self._client_options)
        )

    async def aclose(self) -> None:
        """Stop the pub/sub reader and subscriptions, then close this bundle's connections."""
        await self._signals.aclose()
        await self.client.aclose()
        await self._pool.aclose()
