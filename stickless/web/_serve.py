"""`stickless serve`: one node with the HTTP gateway, under uvicorn (see the README, "Serve
over HTTP")."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from .._config import DeploymentMode, RouterConfig
from .._logs import get_logger
from ..backends.base import Backends
from ..router import SessionRouter
from ._app import create_app
from ._auth import Authenticator, BearerTokens

if TYPE_CHECKING:
    from ..metrics import PrometheusMetrics

log = get_logger("stickless.web")

#: The agent every `stickless serve` node opens unless `--opener` names another.
DEFAULT_OPENER = "stickless.demo.opener:make_opener"


@dataclass(frozen=True)
class ServeOptions:
    """What `stickless serve` was asked for."""

    redis_url: str | None = None
    allow_evicting_redis: bool = False
    redis_ca: str | None = None
    namespace: str = "stickless"
    opener: str = DEFAULT_OPENER
    host: str = "127.0.0.1"
    port: int = 8000
    node_id: str | None = None
    tokens: str | None = None
    no_auth: bool = False
    grace: float = 5.0
    config_overrides: dict[str, Any] = field(default_factory=dict)


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (so serving it without tokens exposes nothing)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(options: ServeOptions) -> None:
    """Raises: ValueError: a non-loopback host without tokens and without `--no-auth`."""
    if not is_loopback(options.host) and options.tokens is None and not options.no_auth:
        raise ValueError(
            f"--host {options.host} is reachable from other machines: pass --tokens FILE "
            "(bearer tokens), or --no-auth to serve it unauthenticated on purpose"
        )


def prometheus_exporter() -> PrometheusMetrics | None:
    """The node's Prometheus exporter, or None (no `/metrics`) without the `metrics` extra."""
    try:
        from ..metrics import PrometheusMetrics
    except ImportError:
        log.warning("GET /metrics is off: prometheus-client is not installed (stickless[metrics])")
        return None
    return PrometheusMetrics()


def build_router(
    options: ServeOptions, metrics: PrometheusMetrics | None = None
) -> tuple[SessionRouter, Backends]:
    """The node's router (reporting to `metrics`): over Redis when `--redis` is given, else in
    memory (one node)."""
    from ..node._service import load_opener

    opener = load_opener(options.opener)
    if options.redis_url is None:
        from ..backends.memory import MemoryBackends

        config = RouterConfig(node_id=options.node_id, **options.config_overrides)
        backends: Backends = MemoryBackends()
    else:
        from ..backends.redis import RedisBackends

        node_id = options.node_id or f"web-{socket.gethostname()}-{options.port}"
        config = RouterConfig(
            node_id=node_id, mode=DeploymentMode.DISTRIBUTED, **options.config_overrides
        )
        backends = RedisBackends.from_url(
            options.redis_url,
            namespace=options.namespace,
            allow_evicting_redis=options.allow_evicting_redis,
            ssl_ca_certs=options.redis_ca,
        )
    router = SessionRouter.build(config=config, opener=opener, backends=backends, metrics=metrics)
    return router, backends


async def serve(options: ServeOptions) -> int:
    """Serve until SIGTERM/SIGINT, then close gracefully: no new connections, open streams
    get `grace` seconds, running turns end, the lease and handles are released.

    Prints `READY <port> <node id>` on stdout once the node takes requests.

    Raises:
        SetupError: the opener, the tokens file or the router's config is unusable.
    """
    authenticator: Authenticator | None = None
    metrics = prometheus_exporter()
    try:
        if options.tokens is not None:
            authenticator = BearerTokens.from_file(options.tokens)
        router, backends = build_router(options, metrics)
    except (ValueError, OSError) as exc:
        raise SetupError(str(exc)) from exc
    app = create_app(
        router,
        authenticator=authenticator,
        manage_router=True,
        close_grace=options.grace,
        metrics=metrics,
    )
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level="warning",
        # uvicorn's records go to the handler the CLI set up (text or JSON), like stickless's.
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=max(int(options.grace), 1),
    )
    server = _AnnouncingServer(config, router.node_id)
    try:
        await server.serve()
    finally:
        with contextlib.suppress(Exception):
            await backends.aclose()
    return 0 if server.started else 1


class _AnnouncingServer(uvicorn.Server):
    """uvicorn's server, printing the READY line once it listens."""

    def __init__(self, config: uvicorn.Config, node_id: str) -> None:
        super().__init__(config)
        self._node_id = node_id

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn raises a captured signal again once shut down (the process then dies of
        # it); the shutdown is complete by then, so the process exits 0 instead.
        self._captured_signals.clear()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            port = self.servers[0].sockets[0].getsockname()[1]
            print(f"READY {port} {self._node_id}", flush=True)


class SetupError(Exception):
    """The node cannot be set up as asked (an opener not found, a bad tokens file, ...)."""


def main_serve(options: ServeOptions) -> int:
    """Entry point of `stickless serve` (logging is configured by the CLI): a bad option is a
    one-line message and exit code 2, not a traceback."""
    try:
        check_exposure(options)
    except ValueError as exc:
        print(f"stickless serve: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(options))
    except SetupError as exc:
        print(f"stickless serve: {exc}", file=sys.stderr)
        return 2
