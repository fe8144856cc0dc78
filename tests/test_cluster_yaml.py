"""cluster.yaml (repo root) passes Ray's own cluster-launcher validation and does every step:
install stickless, start Redis and Ray, deploy the routers with a command our CLI accepts."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from stickless.cli import build_parser

from .ray_cluster import import_ray, require

CLUSTER_YAML = Path(__file__).resolve().parent.parent / "cluster.yaml"


@pytest.fixture(scope="module")
def prepared() -> dict[str, Any]:
    import_ray()
    yaml = require("yaml")
    require("jsonschema")
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(CLUSTER_YAML.read_text())
    config: dict[str, Any] = prepare_config(raw)  # fills the provider's defaults
    validate_config(config)  # Ray's JSON schema and consistency checks; raises when invalid
    return config


def test_cluster_yaml_is_a_valid_local_cluster(prepared: dict[str, Any]) -> None:
    assert prepared["provider"]["type"] == "local"
    assert prepared["provider"]["head_ip"]
    assert len(prepared["provider"]["worker_ips"]) == prepared["max_workers"] >= 1
    assert prepared["auth"]["ssh_user"]


def test_every_node_installs_stickless_from_the_mounted_clone(prepared: dict[str, Any]) -> None:
    # The clone `ray up` runs in is copied to ~/stickless on every node (no package index has
    # stickless), without the local virtualenv
    assert prepared["file_mounts"] == {"~/stickless": "."}
    assert "**/.venv" in prepared["rsync_exclude"]
    for commands in (prepared["head_setup_commands"], prepared["worker_setup_commands"]):
        installs = [shlex.split(c) for c in commands if "pip install" in c]
        assert installs, commands
        assert installs[0][-1] == "$HOME/stickless[ray,redis]"


def test_head_starts_redis_then_ray_then_deploys(prepared: dict[str, Any]) -> None:
    head = prepared["head_start_ray_commands"]
    redis = next(i for i, c in enumerate(head) if "redis-server --daemonize yes" in c)
    ray_start = next(i for i, c in enumerate(head) if "ray start --head" in c)
    deploy = next(i for i, c in enumerate(head) if "stickless ray-deploy" in c)
    assert redis < ray_start < deploy
    assert "--bind 0.0.0.0" in head[redis]
    assert "STICKLESS_REDIS_URL" in head[redis]  # skipped when a managed Redis is configured
    # Redis must not take the port Ray's GCS listens on.
    assert "--port 6380" in head[redis] and "--port=6379" in head[ray_start]
    workers = prepared["worker_start_ray_commands"]
    assert any("ray start --address=$RAY_HEAD_IP:6379" in c for c in workers)


def test_the_deploy_command_is_one_our_cli_accepts(prepared: dict[str, Any]) -> None:
    line = next(c for c in prepared["head_start_ray_commands"] if "stickless ray-deploy" in c)
    argv = shlex.split(line)
    assert argv[:2] == ["stickless", "ray-deploy"]
    args = build_parser().parse_args(argv[1:])
    assert "STICKLESS_REDIS_URL" in args.redis and ":6380/0" in args.redis
    assert args.opener == "stickless.demo.opener:make_opener"
    assert args.namespace == "stickless"
