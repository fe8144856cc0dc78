"""A local multi-node Ray cluster on loopback for tests (started and stopped by the fixture)."""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from stickless.local_services import LOOPBACK, RAY_ENV, local_ray_cluster

T = TypeVar("T")

REPO = str(Path(__file__).resolve().parent.parent)


def require(module: str) -> Any:
    """Import a module the test needs: a failure under CI=true, a skip elsewhere when missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{module} is not installed but CI=true requires this test")
        pytest.skip(f"{module} is not installed")


def import_ray() -> Any:
    """Ray, or a failure under CI=true / a skip elsewhere when it is not installed."""
    os.environ.update(RAY_ENV)
    try:
        import ray
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("ray is not installed but CI=true requires the Ray tests")
        pytest.skip("ray is not installed")
    return ray


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """Three Ray nodes on 127.0.0.1 (one head, two workers); the driver is connected."""
    import_ray()
    try:
        # Worker processes must import the test openers (tests.*): the repo goes on their path.
        with local_ray_cluster(3, python_path=[REPO], logging_level=None) as local:
            yield local.cluster
    finally:
        sys.modules.pop("ray.cluster_utils", None)


# ---------------------------------------------------------------------- cluster helpers


def add_worker(cluster: Any) -> str:
    """Start one more worker node on loopback; returns its Ray node id (hex)."""
    node = cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    cluster.wait_for_nodes()
    return str(node.node_id)


def remove_worker(cluster: Any, ray_node_id: str) -> None:
    """Stop every process of a worker node (its raylet, workers and actors), by their pids."""
    for node in list(cluster.worker_nodes):
        if node.node_id == ray_node_id:
            cluster.remove_node(node)
            return
    raise LookupError(f"no worker node {ray_node_id} in this cluster")


def worker_ids(cluster: Any) -> list[str]:
    """The Ray node ids of the cluster's worker nodes (the head excluded)."""
    return sorted(str(node.node_id) for node in cluster.worker_nodes)


def head_id(cluster: Any) -> str:
    return str(cluster.head_node.node_id)


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `probe` until it returns something other than None (or False); bounded.

    Exceptions from the probe count as "not yet" (a router being recreated may not answer).

    Raises:
        TimeoutError: nothing within `timeout` seconds (naming `what` and the last error).
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = probe()
        except Exception as exc:
            last, value = exc, None
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s (last error: {last!r})")
        time.sleep(interval)
