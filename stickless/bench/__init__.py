"""Benchmarks of stickless, run by `stickless bench` (see benchmarks/README.md).

One module per scenario; each exposes ``TITLE``, ``BASELINE`` (what it is compared with, measured
in the same run) and ``async def run(ctx: BenchContext) -> dict`` returning its results,
``ratios``, table ``rows`` (measurement, stickless, baseline, ratio), ``goals`` and ``notes``.
Modules are imported only when their scenario runs.

Adding a scenario (the Ray comparison is the next one): write ``stickless/bench/<name>.py``
with that interface and add ``"<name>": "stickless.bench.<name>"`` below. A ``ray`` scenario
would start a local Ray cluster in ``run`` (``ctx.processes`` stops what it starts by pid,
``ctx.redis_url`` is the run's private Redis), compare ``stickless.ray`` routers with the same
workloads as ``relay``/``turns``, and add the ``ray.kill`` failover variant next to
``failover``'s SIGKILL one.
"""

#: Scenario name -> module, in run order.
SCENARIOS: dict[str, str] = {
    "relay": "stickless.bench.relay",
    "turns": "stickless.bench.turns",
    "sessions": "stickless.bench.sessions",
    "idle": "stickless.bench.idle",
    "contention": "stickless.bench.contention",
    "failover": "stickless.bench.failover",
    # "ray": "stickless.bench.ray_compare",  # hook: the Ray comparison (not written yet)
}

__all__ = ["SCENARIOS"]
