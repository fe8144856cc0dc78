"""A local multi-node Ray cluster on loopback for tests (started and stopped by the fixture)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: Keep Ray on 127.0.0.1 and quiet (DESIGN.md §7).
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
REPO = str(Path(__file__).resolve().parent.parent)


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
    ray = import_ray()
    from ray.cluster_utils import Cluster

    # Worker processes must import the test openers (tests.*): put the repo on their path.
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, previous) if p)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1"},
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous
        sys.modules.pop("ray.cluster_utils", None)
