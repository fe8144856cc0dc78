"""`stickless bench --quick` runs every scenario end to end and writes numbers for each.

Smoke test only: speed is measured by the benchmarks, never asserted here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stickless.bench import SCENARIOS
from stickless.cli import main

from .ray_cluster import import_ray
from .redis_fixture import redis_executable
from .web_cluster import haproxy_executable

RAY = "ray"
HTTP = "http"
#: Scenarios with a test of their own (they need Ray, haproxy).
OWN_TEST = {RAY, HTTP}


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers(item)


def _check(report: dict[str, Any], names: list[str]) -> None:
    assert list(report["scenarios"]) == names
    machine = report["machine"]
    assert machine["nproc"] >= 1
    assert machine["cpu_model"]
    assert machine["python"]
    assert machine["redis_server"]
    for name, data in report["scenarios"].items():
        assert "error" not in data, (name, data.get("error"))
        numbers = list(_numbers(data["results"]))
        assert numbers, name
        assert all(math.isfinite(n) for n in numbers), name
        assert data["rows"], name
        assert isinstance(data["ratios"], dict), name
        assert data["elapsed_s"] > 0, name
    assert all(goal["scenario"] in names for goal in report["goals"])


def _quick(tmp_path: Path, names: list[str]) -> dict[str, Any]:
    output = tmp_path / "bench.json"
    args = ["bench", "--quick", "--only", ",".join(names), "--output", str(output)]
    code = main([*args, "--redis-server", redis_executable()])
    report: dict[str, Any] = json.loads(output.read_text(encoding="utf-8"))
    errors = {name: data.get("error") for name, data in report["scenarios"].items()}
    assert code == 0, errors
    assert report["mode"] == "quick"
    return report


@pytest.mark.timeout(240)
def test_quick_bench_reports_every_scenario(tmp_path: Path) -> None:
    """Every scenario but `ray` and `http` (which need Ray, haproxy: see the next tests)."""
    names = [name for name in SCENARIOS if name not in OWN_TEST]
    report = _quick(tmp_path, names)
    _check(report, names)
    scenarios = report["scenarios"]
    turns = scenarios["turns"]["results"]
    assert {"floor_local", "floor_forwarded"} <= set(turns["latency_ms"])
    assert turns["redis_commands_per_turn"]["floor_local"]["sent_total"] >= 2
    sustained = scenarios["sustained"]["results"]
    assert sustained["stickless"]["turns"] > 0
    assert sustained["commandstats_per_turn"]["calls_total"] > 0
    assert sustained["monitor_sample_per_turn"]["scripts"]
    checkpoints = scenarios["renewal"]["results"]["checkpoints"]
    assert [point["sessions"] for point in checkpoints] == [1000, 5000]
    assert all(point["held"] == point["sessions"] for point in checkpoints)


@pytest.mark.timeout(180)
def test_quick_bench_ray_scenario(tmp_path: Path) -> None:
    """The Ray comparison: a local Ray cluster started and stopped by the scenario."""
    import_ray()  # skipped without Ray (a failure under CI=true)
    report = _quick(tmp_path, [RAY])
    _check(report, [RAY])
    results = report["scenarios"][RAY]["results"]
    assert results["memory"]["actor_processes"] >= 1
    assert results["failover"]["fast_failover_on"]["outcome"] == "HOLDER_LOST"


@pytest.mark.timeout(120)
def test_quick_bench_http_scenario(tmp_path: Path) -> None:
    """The HTTP gateway: serve processes behind haproxy, against the Python API."""
    haproxy_executable()  # skipped without haproxy (a failure under CI=true)
    report = _quick(tmp_path, [HTTP])
    _check(report, [HTTP])
    results = report["scenarios"][HTTP]["results"]
    assert results["turn_latency_ms"]["http"]["all"]["n"] > 0
    assert results["event_latency_ms"]["python"]["n"] > 0
    assert results["burst_events_dropped"] == {"http": 0, "python": 0}
    ratios = report["scenarios"][HTTP]["ratios"]
    assert {"turn_p50", "turn_p99", "event_p50", "event_p99", "events_per_s"} <= set(ratios)


def test_only_selects_and_rejects_unknown(tmp_path: Path) -> None:
    assert main(["bench", "--only", "nope", "--output", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()
