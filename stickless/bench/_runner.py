"""The `stickless bench` runner: machine info, shared context, scenario loop, JSON and table."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ..local_services import RedisServer, find_redis_server
from . import SCENARIOS
from ._procs import START_TIMEOUT, STOP_TIMEOUT, NodeProc, Processes

#: Version of the JSON layout written by `stickless bench`.
FORMAT = 1


@dataclass
class BenchContext:
    """What every scenario gets: the mode, the private Redis, process helpers, progress output."""

    quick: bool
    redis_url: str
    processes: Processes
    workdir: Path
    started: float = field(default_factory=time.monotonic)
    _serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    scenario: str = ""

    def pick(self, full: Any, quick: Any) -> Any:
        """The full-mode or the quick-mode value of a setting."""
        return quick if self.quick else full

    def unique(self, prefix: str) -> str:
        """A name unique within this run (namespaces, node ids, session ids)."""
        return f"{prefix}{next(self._serial)}"

    def progress(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        sys.stdout.write(f"[{elapsed:7.1f}s] {self.scenario:<10} {text}\n")
        sys.stdout.flush()

    async def node(self, node_id: str, namespace: str, config: dict[str, Any]) -> NodeProc:
        """Start a `stickless node` process running the bench agent (stopped by the caller,
        or at the end of the run by pid)."""
        proc = NodeProc(self.processes, node_id, self.redis_url, namespace, config, self.workdir)
        return await proc.start()


# ====================================================================== machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_mb() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


async def machine_info(redis_url: str) -> dict[str, Any]:
    """nproc, CPU model, memory, Python, redis-py/hiredis and redis-server versions, load."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        server = await client.info("server")
    finally:
        await client.aclose()
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_mb": _mem_total_mb(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "stickless": _version("stickless"),
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis"),
        "pydantic": _version("pydantic"),
        "redis_server": str(server.get("redis_version")),
        "load_average_start": load_average(),
    }


# ====================================================================== run


def selected(only: str | None) -> list[str]:
    """Scenario names to run, in registry order.

    Raises:
        ValueError: an unknown name.
    """
    if not only:
        return list(SCENARIOS)
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise ValueError(
            f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}"
        )
    return [name for name in SCENARIOS if name in names]


async def run_bench(
    names: Sequence[str], *, quick: bool, redis_server: str | None
) -> dict[str, Any]:
    """Run the scenarios; the report (a scenario that failed has an "error" instead of numbers)."""
    executable = find_redis_server(redis_server)
    if executable is None:
        raise RuntimeError(
            "the Redis scenarios need redis-server (apt-get install redis-server, "
            "or pass --redis-server PATH)"
        )
    processes = Processes()
    started_wall = time.time()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stickless-bench-") as tmp:
        workdir = Path(tmp)
        redis = RedisServer(
            workdir / "redis",
            executable=executable,
            start_timeout=START_TIMEOUT,
            stop_timeout=STOP_TIMEOUT,
        )
        try:
            await asyncio.to_thread(redis.start)
            ctx = BenchContext(
                quick=quick, redis_url=redis.url, processes=processes, workdir=workdir
            )
            machine = await machine_info(redis.url)
            scenarios: dict[str, Any] = {}
            for name in names:
                ctx.scenario = name
                module = importlib.import_module(SCENARIOS[name])
                ctx.progress(f"start: {module.TITLE}")
                t0 = time.monotonic()
                try:
                    result: dict[str, Any] = await module.run(ctx)
                except Exception as exc:  # a failed scenario is reported, the others still run
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                    ctx.progress(f"FAILED: {result['error']}")
                elapsed = time.monotonic() - t0
                scenarios[name] = {
                    "title": module.TITLE,
                    "baseline": module.BASELINE,
                    "elapsed_s": round(elapsed, 2),
                    **result,
                }
                ctx.progress(f"done in {elapsed:.1f}s")
        finally:
            redis.stop()
            processes.stop_all()
    machine["load_average_end"] = load_average()
    report = {
        "format": FORMAT,
        "started_at": datetime.datetime.fromtimestamp(started_wall, datetime.UTC).isoformat(
            timespec="seconds"
        ),
        "command": "stickless bench" + (" --quick" if quick else ""),
        "mode": "quick" if quick else "full",
        "scenarios_run": list(names),
        "total_elapsed_s": round(time.monotonic() - started, 2),
        "machine": machine,
        "scenarios": scenarios,
        "goals": [
            {"scenario": name, **goal}
            for name, data in scenarios.items()
            for goal in data.get("goals", [])
        ],
    }
    return report


# ====================================================================== report


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value == 0:
            return "0"
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude >= 100:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as aligned plain-text columns."""
    cells = [[str(h) for h in headers], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for index, row in enumerate(cells):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if index == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render(report: dict[str, Any]) -> str:
    """The readable summary: machine, one table per scenario, then the goals."""
    machine = report["machine"]
    out = [
        "\n" + "=" * 100,
        f"stickless bench ({report['mode']}) on {machine['nproc']} CPU(s) {machine['cpu_model']}, "
        f"Python {machine['python']}, redis-py {machine['redis_py']}, "
        f"redis-server {machine['redis_server']}; load {machine['load_average_start']} -> "
        f"{machine.get('load_average_end')}; total {report['total_elapsed_s']:.1f}s",
        "=" * 100,
    ]
    for name, data in report["scenarios"].items():
        out.append(f"\n[{name}] {data['title']}  ({data['elapsed_s']:.1f}s)")
        out.append(f"  baseline: {data['baseline']}")
        if "error" in data:
            out.append(f"  ERROR: {data['error']}")
            continue
        rows = data.get("rows", [])
        if rows:
            out.append(table(["measurement", "stickless", "baseline", "ratio"], rows).rstrip())
        for note in data.get("notes", []):
            out.append(f"  note: {note}")
    goals = report.get("goals", [])
    if goals:
        out.append("\nGoals")
        out.append(
            table(
                ["scenario", "goal", "target", "measured", "met"],
                [[g["scenario"], g["goal"], g["target"], g["measured"], g["met"]] for g in goals],
            ).rstrip()
        )
    return "\n".join(out) + "\n"


# ====================================================================== entry


def main_bench(args: argparse.Namespace) -> int:
    """Entry point of `stickless bench` (arguments parsed by the CLI)."""
    try:
        names = selected(args.only)
    except ValueError as exc:
        sys.stderr.write(f"stickless bench: {exc}\n")
        return 2
    try:
        report = asyncio.run(run_bench(names, quick=args.quick, redis_server=args.redis_server))
    except RuntimeError as exc:
        sys.stderr.write(f"stickless bench: {exc}\n")
        return 1
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    sys.stdout.write(render(report))
    sys.stdout.write(f"\nresults written to {output}\n")
    sys.stdout.flush()
    failed = [name for name, data in report["scenarios"].items() if "error" in data]
    return 1 if failed else 0
