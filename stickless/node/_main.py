"""`stickless node`: run one router as its own OS process over Redis, served on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from typing import Any

from .._config import DeploymentMode, RouterConfig
from ..router import SessionRouter
from ._server import NodeServer
from ._service import NodeService, load_opener


async def run_node(
    *,
    redis_url: str,
    namespace: str,
    node_id: str,
    opener: str,
    port: int = 0,
    grace: float = 5.0,
    config_overrides: dict[str, Any] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    allow_evicting_redis: bool = False,
    redis_ca: str | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT or a `shutdown` request, then close gracefully; with
    `metrics_port`, the router's Prometheus metrics at `http://metrics_host:metrics_port/metrics`.

    Prints `READY <port> <node id>` on stdout once the router and the server are up (the
    node id with this process's incarnation, unless the config turned that off).
    """
    from ..backends.redis import RedisBackends

    config = RouterConfig(
        node_id=node_id, mode=DeploymentMode.DISTRIBUTED, **(config_overrides or {})
    )
    backends = RedisBackends.from_url(
        redis_url,
        namespace=namespace,
        allow_evicting_redis=allow_evicting_redis,
        ssl_ca_certs=redis_ca,
    )
    metrics = None
    if metrics_port is not None:
        from ..metrics import PrometheusMetrics

        metrics = PrometheusMetrics()
    router = SessionRouter.build(
        config=config, opener=load_opener(opener), backends=backends, metrics=metrics
    )
    await router.start()
    exporter = (
        None
        if metrics_port is None or metrics is None
        else metrics.serve(metrics_port, metrics_host)
    )
    service = NodeService(router)
    server = NodeServer(service, port=port)
    bound = await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"READY {bound} {router.node_id}", flush=True)
    shutdown = asyncio.ensure_future(server.shutdown_requested.wait())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({shutdown, stopped}, return_when=asyncio.FIRST_COMPLETED)
    shutdown.cancel()
    stopped.cancel()
    await service.aclose(grace=grace)
    await server.aclose()
    if exporter is not None:
        exporter.shutdown()
    with contextlib.suppress(Exception):
        await backends.aclose()
    return 0


def parse_overrides(raw: str | None) -> dict[str, Any]:
    """RouterConfig overrides given as a JSON object on the command line.

    Raises:
        ValueError: the text is not a JSON object.
    """
    if not raw:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("--config must be a JSON object of RouterConfig fields")
    return value


def main_node(args: Any) -> int:
    """Entry point of `stickless node` (logging is configured by the CLI)."""
    return asyncio.run(
        run_node(
            redis_url=args.redis,
            namespace=args.namespace,
            node_id=args.node_id,
            opener=args.opener,
            port=args.port,
            grace=args.grace,
            config_overrides=parse_overrides(args.config),
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            allow_evicting_redis=args.redis_allow_eviction,
            redis_ca=args.redis_ca,
        )
    )
