"""The Redis backends bundle: every storage role over one redis-py asyncio client."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ResponseError

from ..._errors import StoreMisconfiguredError
from ..._events import Event
from ..base import (
    DEFAULT_EVENT_LOG_MAX_LEN,
    DEFAULT_EVENT_LOG_TTL,
    ChatStreams,
    DeadLetterStore,
    EventLog,
    HotPath,
    IdempotencyStore,
    Inbox,
    LeaseStore,
    Liveness,
    RecordStore,
    SessionOwners,
    SignalBus,
)
from ._connect import Connections, connect
from ._dead_letters import RedisDeadLetterStore
from ._eventlog import RedisEventLog
from ._hotpath import RedisHotPath
from ._idempotency import RedisIdempotencyStore
from ._inbox import RedisInbox
from ._keys import Keys
from ._liveness import RedisLiveness
from ._scripts import Scripts
from ._server import (
    EvictingRedisError,
    EvictionVerdict,
    access_error,
    check_access,
    check_ca_file,
    connect_check,
    eviction_message,
    eviction_warning,
    judge_eviction_policy,
    parse_policy,
)
from ._signals import RedisSignalBus
from ._stores import RedisChatStreams, RedisLeaseStore, RedisRecordStore, RedisSessionOwners

#: Default bound (seconds) of connecting and of waiting for one reply.
DEFAULT_SOCKET_TIMEOUT = 5.0
#: Connections one bundle opens at most for commands (pub/sub has its own).
DEFAULT_MAX_CONNECTIONS = 64
#: Default bound (seconds) of waiting for a free pooled connection.
DEFAULT_POOL_TIMEOUT = 30.0
#: Default prefix of the bundle's connection names (`client_name=` replaces it).
DEFAULT_CLIENT_NAME = "stickless"
#: Default seconds a fencing-token counter outlives the expiry of the last lease it served.
DEFAULT_TOKEN_TTL = 7 * 86_400.0
#: Default seconds an uncollected inbox tier lives after its last delivery.
DEFAULT_INBOX_TTL = 86_400.0


@dataclass(frozen=True, slots=True)
class Retention:
    """How long the per-session keys live (see `RedisBackends.from_url`)."""

    event_log_max_len: int = DEFAULT_EVENT_LOG_MAX_LEN
    event_log_ttl: float = DEFAULT_EVENT_LOG_TTL
    token_ttl: float = DEFAULT_TOKEN_TTL
    inbox_ttl: float = DEFAULT_INBOX_TTL

    def __post_init__(self) -> None:
        if self.event_log_max_len < 1:
            raise ValueError("event_log_max_len must be at least 1")
        for name in ("event_log_ttl", "token_ttl", "inbox_ttl"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds")


def _bounded_timeouts(socket_timeout: float, socket_connect_timeout: float | None) -> float:
    """The connect timeout (the socket timeout unless given), both checked bounded: every store
    call is, so a stalled path fails calls instead of hanging them ("Node liveness").

    Raises:
        ValueError: a timeout that is not a positive, finite number of seconds.
    """
    connect_timeout = socket_timeout if socket_connect_timeout is None else socket_connect_timeout
    for field, bound in (
        ("socket_timeout", socket_timeout),
        ("socket_connect_timeout", connect_timeout),
    ):
        if not (isinstance(bound, int | float) and math.isfinite(bound) and bound > 0):
            raise ValueError(f"{field} must be a positive, finite number of seconds")
    return connect_timeout


def _open(
    url: str, client_options: dict[str, Any], allow_evicting_redis: bool, role: str
) -> Connections:
    """The pools of a bundle: commands (named for `role`) and pub/sub."""
    # A blocking pool: callers past `max_connections` wait (up to `pool_timeout`) for a
    # free connection instead of failing at once with "Too many connections", so a burst
    # of work on a healthy server queues instead of turning into 503s or failed turns.
    pool_options = dict(client_options)
    max_connections = int(pool_options.pop("max_connections", DEFAULT_MAX_CONNECTIONS))
    pool_timeout = float(pool_options.pop("pool_timeout", DEFAULT_POOL_TIMEOUT))
    name = str(pool_options.pop("client_name", None) or DEFAULT_CLIENT_NAME)
    # Every command connection checks the eviction policy as it connects, so a reconnect
    # (a restart, a failover) to a server that may evict keys is refused too. The pub/sub
    # connection never retries inside redis-py: its reader reconnects by itself.
    return connect(
        url,
        {
            "max_connections": max_connections,
            "timeout": pool_timeout,
            "redis_connect_func": connect_check(allow_evicting_redis),
            "client_name": f"{name}:{role}",
            **pool_options,
        },
        {
            **pool_options,
            "client_name": f"{name}:pubsub",
            "retry": Retry(NoBackoff(), 0, supported_errors=()),
        },
    )


class RedisBackends:
    """Every storage role on one Redis server; one pool per bundle."""

    #: Shared across processes: DISTRIBUTED routers accept this bundle.
    distributed: ClassVar[bool] = True

    # Typed as the roles so the bundle satisfies `Backends`, whose attributes are invariant.
    leases: LeaseStore
    liveness: Liveness
    records: RecordStore
    inbox: Inbox
    signals: SignalBus
    idempotency: IdempotencyStore
    events: EventLog
    dead_letters: DeadLetterStore
    owners: SessionOwners
    chat_streams: ChatStreams
    hotpath: HotPath

    def __init__(
        self,
        url: str,
        namespace: str,
        retention: Retention,
        client_options: dict[str, Any],
        allow_evicting_redis: bool = False,
        role: str = "commands",
    ) -> None:
        """Open a client (connections are made lazily); prefer `from_url`. Its connections
        are named `<client_name>:<role>` and `<client_name>:pubsub` (CLIENT LIST shows which
        pool a connection belongs to)."""
        self._url = url
        self._namespace = namespace
        self.retention = retention
        self._client_options = client_options
        self.allow_evicting_redis = allow_evicting_redis
        self.keys = Keys(namespace)
        self._connections = _open(url, client_options, allow_evicting_redis, role)
        self._pool = self._connections.pool
        self.client: Redis = Redis(connection_pool=self._pool)
        pubsub_client = self._connections.pubsub
        scripts = Scripts(self.client, self.keys.live_prefix)
        self.leases = RedisLeaseStore(self.client, scripts, self.keys, retention.token_ttl)
        self.liveness = RedisLiveness(self.client, scripts, self.keys)
        self.records = RedisRecordStore(self.client, scripts, self.keys)
        self.inbox = RedisInbox(self.client, scripts, self.keys, retention.inbox_ttl)
        self._signals = RedisSignalBus(
            self.client,
            pubsub_client,
            self.keys,
            float(client_options["socket_timeout"] or DEFAULT_SOCKET_TIMEOUT),
        )
        self.signals = self._signals
        idempotency = RedisIdempotencyStore(self.client, scripts, self.keys, retention.inbox_ttl)
        self.idempotency = idempotency
        self._event_log = RedisEventLog(
            self.client, scripts, self.keys, retention.event_log_max_len, retention.event_log_ttl
        )
        self.events = self._event_log
        self.dead_letters = RedisDeadLetterStore(self.client, scripts, self.keys)
        self.owners = RedisSessionOwners(self.client, scripts, self.keys)
        self.chat_streams = RedisChatStreams(
            self.client, scripts, self.keys, retention.event_log_ttl
        )
        self.hotpath = RedisHotPath(idempotency, self._event_log, self.inbox)

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "stickless",
        *,
        event_log_max_len: int = DEFAULT_EVENT_LOG_MAX_LEN,
        event_log_ttl: float = DEFAULT_EVENT_LOG_TTL,
        token_ttl: float = DEFAULT_TOKEN_TTL,
        inbox_ttl: float = DEFAULT_INBOX_TTL,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
        allow_evicting_redis: bool = False,
        ssl_ca_certs: str | None = None,
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
        Connections are named `<client_name>:commands` (the router's command pool),
        `:renewal` (its lease renewer's) and `:pubsub`; `client_name` defaults to "stickless".

        The server must not evict keys (`maxmemory-policy noeviction`): `verify()` refuses any
        other policy, and so does every new command connection (after a restart or a failover),
        unless `allow_evicting_redis` accepts the risk (a completed turn may then run again, and
        a transcript may vanish).

        TLS: a `rediss://` URL, with `ssl_ca_certs` naming the CA file that signed the server's
        certificate (redis-py also reads `?ssl_ca_certs=FILE` from the URL). An ACL user (the
        URL's `user:password@`) needs the rule `acl_rule` gives; `verify()` probes it.

        Retention (every per-session key has one; see the README section "Redis memory and
        retention" for the full key inventory; Redis >= 7.0 is required):

        - `event_log_max_len` (default 10,000): frames one session's event log keeps, exactly
          (older ones are trimmed on append and reported to a resume from before them).
        - `event_log_ttl` (default 86,400 s = 1 day): the event log (and the empty tombstone a
          delete leaves) expires this long after its last append or delete.
        - `token_ttl` (default 604,800 s = 7 days): the fencing-token counter expires this long
          after the lease it last issued or renewed would expire. A counter that expired (or was
          lost) restarts from the server clock in microseconds, above every token issued before,
          so fencing holds either way; the TTL adds a margin against the clock stepping back.
        - `inbox_ttl` (default 86,400 s = 1 day): a session's inbox tier that nobody collects
          expires this long after its last delivery (a safety net; keep it far above
          `forward_ttl`, after which every waiting caller was already answered).

        Raises:
            ValueError: a bound that is not positive (`max_connections`, `pool_timeout`), or a
                socket timeout that is not a positive, finite number of seconds.
        """
        if max_connections < 1 or pool_timeout <= 0:
            raise ValueError("max_connections must be >= 1 and pool_timeout > 0")
        if ssl_ca_certs is not None:
            client_options["ssl_ca_certs"] = check_ca_file(url, ssl_ca_certs)
        connect_timeout = _bounded_timeouts(socket_timeout, socket_connect_timeout)
        options: dict[str, Any] = {
            "max_connections": max_connections,
            "pool_timeout": pool_timeout,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            **client_options,
        }
        retention = Retention(event_log_max_len, event_log_ttl, token_ttl, inbox_ttl)
        return cls(url, namespace, retention, options, allow_evicting_redis)

    @property
    def namespace(self) -> str:
        """The key prefix of this bundle."""
        return self._namespace

    async def append_and_publish(
        self, session_id: str, origin: str, batch_id: str, frames: Sequence[Event]
    ) -> list[str]:
        """Log and publish a relay batch in one script (see `EventRelayPath`)."""
        return await self._event_log.append_and_publish(session_id, origin, batch_id, frames)

    def clone(self, role: str = "clone") -> RedisBackends:
        """A new bundle over the same server and namespace with its own connection pool, its
        connections named for `role`."""
        return RedisBackends(
            self._url,
            self._namespace,
            self.retention,
            dict(self._client_options),
            self.allow_evicting_redis,
            role,
        )

    def watch_answers(self, answered: Callable[[], None]) -> None:
        """Call `answered` whenever a command over this bundle's pool got the server's answer."""
        self._connections.pool.answered = answered

    async def verify(self) -> tuple[str, ...]:
        """Check that this user may do what stickless does and that the server keeps every key
        stickless writes; the warnings to report.

        Raises:
            StoreMisconfiguredError: the user lacks a permission (or its password is wrong), or
                the server may evict keys and that was not allowed.
        """
        try:
            await check_access(self.client, self.keys)
            policy = parse_policy(await self.client.info("memory"))
        except EvictingRedisError as exc:  # refused as the connection was made
            raise StoreMisconfiguredError(str(exc)) from exc
        except NoPermissionError as exc:
            raise access_error(self.keys, exc) from exc
        except ResponseError:  # INFO renamed
            policy = None
        verdict = judge_eviction_policy(policy, self.allow_evicting_redis)
        if verdict is EvictionVerdict.REFUSED:
            raise StoreMisconfiguredError(eviction_message(policy))
        if verdict is EvictionVerdict.ALLOWED:
            return (eviction_warning(policy),)
        return ()

    async def aclose(self) -> None:
        """Stop the pub/sub reader and subscriptions, then close this bundle's connections."""
        await self._signals.aclose()
        await self.client.aclose()
        await self._pool.aclose()
        await self._connections.close_sentinels()
