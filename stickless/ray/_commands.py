"""`stickless ray-deploy` and `stickless ray-undeploy` (arguments parsed by the CLI)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import ray

from ._deploy import deploy, undeploy


def main_ray_deploy(args: argparse.Namespace) -> int:
    """Connect to a running Ray cluster and deploy (or undeploy) the routers; the exit code."""
    overrides: dict[str, Any] = json.loads(args.config) if args.config else {}
    if not isinstance(overrides, dict):
        sys.stdout.write("--config must be a JSON object of RouterConfig fields\n")
        return 2
    ray.init(address=args.address, namespace=args.namespace, logging_level="WARNING")
    try:
        if args.command == "ray-undeploy":
            undeploy(args.namespace, grace=args.grace)
            sys.stdout.write(f"UNDEPLOYED namespace {args.namespace}\n")
            return 0
        handles = deploy(
            args.redis,
            args.opener,
            args.namespace,
            fast_failover=not args.no_fast_failover,
            reconcile_interval=args.reconcile_interval,
            timeout=args.timeout,
            **overrides,
        )
        pings = ray.get([h.ping.remote() for h in handles.values()], timeout=args.timeout)
        for ping in pings:
            sys.stdout.write(f"router {ping['node_id']} on Ray node {ping['ray_node_id']}\n")
        sys.stdout.write(f"DEPLOYED {len(pings)} router(s) in namespace {args.namespace}\n")
        return 0
    finally:
        ray.shutdown()
