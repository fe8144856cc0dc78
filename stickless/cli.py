"""Command line entry point: argument parsing and dispatch of every `stickless` subcommand.

The commands live elsewhere: the demo in `stickless.demo`, the node process in
`stickless.node`, the Ray deployment in `stickless.ray`, the benchmarks in `stickless.bench`,
the dead-letter commands in `stickless._dlq`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._logs import configure_logging
from .demo import DEMO_CONFIG

__all__ = ["DEMO_CONFIG", "build_parser", "main"]

if TYPE_CHECKING:
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]

# ====================================================================== shared options


def _redis_option(parser: argparse.ArgumentParser, *, required: bool, help: str) -> None:
    parser.add_argument("--redis", required=required, default=None, metavar="URL", help=help)


def _opener_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--opener", required=True, metavar="MODULE:ATTR", help=help)


def _namespace_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--namespace", default="stickless", help=help)


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default=None, metavar="JSON", help="RouterConfig overrides as a JSON object"
    )


def _address_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address", default="auto", help="Ray cluster address (default: auto, the local one)"
    )


def _grace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grace", type=float, default=5.0, help="graceful-shutdown grace in seconds"
    )


def _timeout_option(parser: argparse.ArgumentParser, default: float, what: str) -> None:
    parser.add_argument(
        "--timeout",
        type=float,
        default=default,
        metavar="SECONDS",
        help=f"fail if {what} (default {default:.0f})",
    )


def _redis_server_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """`--redis-sentinel` / `--redis-service` (another way to give `--redis`), the TLS CA and
    the eviction opt-out; `required`: one of `--redis` and `--redis-sentinel` must be given."""
    parser.set_defaults(redis_required=required)
    parser.add_argument(
        "--redis-sentinel",
        default=None,
        metavar="HOST:PORT,...",
        help="reach Redis through these Sentinels (with --redis-service; instead of --redis)",
    )
    parser.add_argument(
        "--redis-service", default=None, metavar="NAME", help="the name the Sentinels monitor"
    )
    parser.add_argument(
        "--redis-ca",
        default=None,
        metavar="FILE",
        help="CA file that signed the Redis server's TLS certificate (with a rediss:// URL)",
    )
    parser.add_argument(
        "--redis-allow-eviction",
        action="store_true",
        help="start although Redis's maxmemory-policy may evict keys (a completed turn may then "
        "run again; warned at every start and shown by /readyz)",
    )


#: The URL forms `--redis` takes.
_REDIS_URL = "redis:// or rediss:// URL"
#: Ray namespace and Redis key prefix of a deployment.
_RAY_NAMESPACE = "Ray namespace and Redis key prefix"


# ====================================================================== demo


def _cmd_demo(args: argparse.Namespace) -> int:
    """The demo in this process (under an overall time bound), or on a local Ray cluster."""
    if args.ray is not None:
        from .demo.console import Console
        from .demo.on_ray import run_ray_demo

        # Cluster start-up is bounded by Ray itself; --timeout bounds the scenes.
        return run_ray_demo(args.ray, args.token_delay, args.redis, args.timeout, Console())
    from .demo.local import main_demo

    return main_demo(args.nodes, args.token_delay, args.redis, args.timeout)


def _add_demo(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "demo",
        help="run the scripted multi-node demo on an in-process cluster",
        description="Show forwarding, cross-node streaming, interrupts, idempotent retries and "
        "a holder crashing mid-turn on a simulated cluster of nodes sharing in-memory backends.",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=3,
        choices=range(3, 10),
        metavar="N",
        help="number of nodes, 3-9 (default 3)",
    )
    parser.add_argument(
        "--token-delay",
        type=float,
        default=0.02,
        metavar="SECONDS",
        help="pause between streamed words (default 0.02)",
    )
    _timeout_option(parser, 30.0, "the demo takes longer")
    _redis_option(
        parser,
        required=False,
        help="run the nodes over this Redis (redis:// or rediss://) instead of in memory",
    )
    parser.add_argument(
        "--ray",
        type=int,
        default=None,
        choices=range(2, 10),
        metavar="N",
        help="run on a local N-node Ray cluster (2-9) on 127.0.0.1, one router actor per node, "
        "over --redis or a private redis-server started for the demo (needs the ray and redis "
        "extras)",
    )
    parser.set_defaults(handler=_cmd_demo)


# ====================================================================== ray-deploy / ray-undeploy


def _cmd_ray_deploy(args: argparse.Namespace) -> int:
    """Connect to a running Ray cluster and deploy (or undeploy) the routers."""
    try:
        from .ray._commands import main_ray_deploy
    except ImportError as exc:
        sys.stdout.write(f"{exc}\n")
        return 1
    return main_ray_deploy(args)


def _add_ray_deploy(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "ray-deploy",
        help="deploy one router actor per node of a running Ray cluster (kept so by a reconciler)",
        description="Connect to a running Ray cluster and place one stickless router actor on "
        "every node (detached; a detached reconciler on the head node keeps one per node as "
        "nodes join and leave). Returns once every router answers; the routers outlive this "
        "command. Used by cluster.yaml's head start commands.",
    )
    _redis_option(parser, required=True, help=_REDIS_URL)
    _opener_option(
        parser,
        "import path of a LiveSessionOpener (or a zero-argument factory of one), "
        "importable on every node",
    )
    _namespace_option(parser, _RAY_NAMESPACE)
    _address_option(parser)
    _config_option(parser)
    parser.add_argument(
        "--no-fast-failover",
        action="store_true",
        help="do not watch peer routers; rely on lease and reservation TTLs only",
    )
    parser.add_argument(
        "--reconcile-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often the reconciler checks every node has a router (default 2)",
    )
    _timeout_option(parser, 120.0, "the routers do not all answer within this")
    parser.set_defaults(handler=_cmd_ray_deploy)
    undeploy = subcommands.add_parser(
        "ray-undeploy",
        help="stop the reconciler and close every router of a namespace gracefully",
        description="Connect to a running Ray cluster, stop the stickless reconciler and close "
        "every router of the namespace gracefully (their sessions are handed back).",
    )
    _namespace_option(undeploy, _RAY_NAMESPACE)
    _address_option(undeploy)
    _grace_option(undeploy)
    undeploy.set_defaults(handler=_cmd_ray_deploy, config=None)


# ====================================================================== node


def _cmd_node(args: argparse.Namespace) -> int:
    """Run one router as this process, over Redis, until SIGTERM."""
    from .node._main import main_node

    return main_node(args)


def _add_node(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "node",
        help="run one node (a router over Redis) as this process, served on loopback",
        description="Run a SessionRouter over Redis in DISTRIBUTED mode and serve it on "
        "127.0.0.1 for clients (stickless.node.NodeClient). Prints 'READY <port> <node id>' "
        "when up; SIGTERM closes it gracefully.",
    )
    _redis_option(parser, required=False, help=_REDIS_URL)
    _redis_server_options(parser, required=True)
    parser.add_argument("--node-id", required=True, help="this node's unique id")
    _opener_option(
        parser, "import path of a LiveSessionOpener, or of a zero-argument factory of one"
    )
    _namespace_option(parser, "Redis key prefix")
    parser.add_argument("--port", type=int, default=0, help="loopback port (0 = any free port)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (needs the metrics extra)",
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="address of --metrics-port (default loopback)"
    )
    _grace_option(parser)
    _config_option(parser)
    parser.set_defaults(handler=_cmd_node)


# ====================================================================== serve


def _cmd_serve(args: argparse.Namespace) -> int:
    """One node with the HTTP gateway under uvicorn, until SIGTERM."""
    from .node._main import parse_overrides
    from .web._serve import ServeOptions, main_serve

    options = ServeOptions(
        redis_url=args.redis,
        allow_evicting_redis=args.redis_allow_eviction,
        redis_ca=args.redis_ca,
        namespace=args.namespace,
        opener=args.opener,
        host=args.host,
        port=args.port,
        node_id=args.node_id,
        tokens=args.tokens,
        no_auth=args.no_auth,
        grace=args.grace,
        config_overrides=parse_overrides(args.config),
    )
    return main_serve(options)


def _add_serve(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "serve",
        help="run one node with the HTTP/SSE gateway and the chat page (needs the web extra)",
        description="Run a SessionRouter with the HTTP gateway under uvicorn. Without --redis: "
        "one embedded node in memory with the demo agent (open http://127.0.0.1:8000/). "
        "Prints 'READY <port> <node id>' when up; SIGTERM shuts it down gracefully.",
    )
    _redis_option(parser, required=False, help=f"{_REDIS_URL} (default: memory, one node)")
    _redis_server_options(parser, required=False)
    _namespace_option(parser, "Redis key prefix")
    parser.add_argument(
        "--opener",
        default="stickless.demo.opener:make_opener",
        metavar="MODULE:ATTR",
        help="import path of a LiveSessionOpener or a factory of one (default: the demo agent)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port (0 = any free port)")
    parser.add_argument("--node-id", default=None, help="this node's unique id")
    parser.add_argument(
        "--tokens", default=None, metavar="FILE", help='bearer tokens, JSON {"token": "principal"}'
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="serve a non-loopback --host without tokens (everyone sees every session)",
    )
    _grace_option(parser)
    _config_option(parser)
    parser.set_defaults(handler=_cmd_serve)


# ====================================================================== bench


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks: JSON results file plus a table on stdout."""
    from .bench._runner import main_bench

    return main_bench(args)


def _add_bench(subcommands: Subcommands) -> None:
    from .bench import SCENARIOS

    parser = subcommands.add_parser(
        "bench",
        help="run the benchmarks (each against its baseline, interleaved in one run)",
        description="Run the benchmark scenarios against a private redis-server on loopback "
        "and node processes started for the run; write a JSON result file and print a table. "
        f"Scenarios: {', '.join(SCENARIOS)}.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds per scenario (CI smoke runs); numbers are rough",
    )
    parser.add_argument(
        "--only",
        default=None,
        metavar="SCENARIO[,...]",
        help="run only these scenarios (comma separated)",
    )
    parser.add_argument(
        "--output",
        default="stickless-bench.json",
        metavar="PATH",
        help="where to write the JSON results (default ./stickless-bench.json)",
    )
    parser.add_argument(
        "--redis-server",
        default=None,
        metavar="PATH",
        help="redis-server executable to start privately (default: redis-server on PATH)",
    )
    parser.set_defaults(handler=_cmd_bench)


# ====================================================================== dlq


def _cmd_dlq(args: argparse.Namespace) -> int:
    """List, show, replay or purge the dead letters of a namespace in Redis."""
    from ._dlq import main_dlq

    return main_dlq(args)


def _add_dlq(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "dlq",
        help="list, show, replay or purge dead letters (messages that will not run again)",
        description="Inspect the dead letters of a namespace in Redis (messages whose last "
        "attempt failed, or that could not be read), replay one under its original "
        "idempotency key, or purge them. Exit codes: 0 done, 1 not found or refused, 2 usage.",
    )
    actions = parser.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help, description=help)
        _redis_option(sub, required=True, help=_REDIS_URL)
        _namespace_option(sub, "Redis key prefix (default stickless)")
        _logging_options(sub, defaults=False)
        sub.set_defaults(handler=_cmd_dlq)
        return sub

    listing = action("list", "one line per letter: id, session, turn, key, reason, attempts, age")
    listing.add_argument("--session", default=None, help="only this session's letters")
    listing.add_argument(
        "--limit", type=int, default=50, help="most letters to list, newest first (default 50)"
    )
    listing.add_argument(
        "--before",
        type=float,
        default=None,
        metavar="DEAD_AT",
        help="only letters that died before this time (a page's last dead_at: the next page)",
    )
    action("show", "print one letter as JSON").add_argument("letter_id", metavar="ID")
    replay = action(
        "replay",
        "queue the letter's message again under its original idempotency key for the "
        "cluster to run, print the new turn id, and remove the letter",
    )
    replay.add_argument("letter_id", metavar="ID")
    _config_option(replay)
    purge = action("purge", "remove every letter (of one session with --session)")
    purge.add_argument("--session", default=None, help="only this session's letters")
    purge.add_argument("--yes", action="store_true", help="really remove them")


# ====================================================================== parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="stickless",
        description="stickless: serialize AI-agent session turns across a cluster.",
    )
    _logging_options(parser, defaults=True)
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo(subcommands)
    _add_node(subcommands)
    _add_serve(subcommands)
    _add_ray_deploy(subcommands)
    _add_bench(subcommands)
    _add_dlq(subcommands)
    for name, command in subcommands.choices.items():
        # Also after the command (`stickless serve --log-format json`); there it overrides.
        if name != "dlq":  # (its actions take them)
            _logging_options(command, defaults=False)
    return parser


def _logging_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    parser.add_argument(
        "--log-level",
        default="WARNING" if defaults else argparse.SUPPRESS,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level on stderr (default WARNING)",
    )
    parser.add_argument(
        "--log-format",
        default="text" if defaults else argparse.SUPPRESS,
        choices=["text", "json"],
        help="log records as text lines or as JSON objects, one per line (default text); "
        "both name the node, session and turn of a record",
    )


def _resolve_redis(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Turn `--redis-sentinel` / `--redis-service` into `args.redis` (exits on a bad mix)."""
    sentinels, service = getattr(args, "redis_sentinel", None), getattr(args, "redis_service", None)
    if sentinels is not None and args.redis is not None:
        parser.error("--redis and --redis-sentinel exclude each other")
    if (sentinels is None) != (service is None):
        parser.error("--redis-sentinel and --redis-service go together")
    if sentinels is not None and service is not None:
        # Imported here: a command without Redis (the demo) needs no redis-py.
        from .backends.redis._connect import sentinel_url

        args.redis = sentinel_url(sentinels, service)
    if getattr(args, "redis_required", False) and args.redis is None:
        parser.error("one of --redis and --redis-sentinel is required")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line, with the Redis options resolved to one URL.

    Raises:
        SystemExit: the command line is malformed (argparse printed why).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    _resolve_redis(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the chosen command; returns the exit code."""
    parser = build_parser()
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    configure_logging(args.log_format, getattr(logging, args.log_level))
    return handler(args)
