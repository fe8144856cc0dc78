"""Benchmarks of stickless, run by `stickless bench` (see benchmarks/README.md).

One module per scenario; each exposes ``TITLE``, ``BASELINE`` (what it is compared with, measured
in the same run) and ``async def run(ctx: BenchContext) -> dict`` returning its results,
``ratios``, table ``rows`` (measurement, stickless, baseline, ratio), ``goals`` and ``notes``.
Modules are imported only when their scenario runs.

Adding a scenario: write ``stickless/bench/<name>.py`` with that interface and add
``"<name>": "stickless.bench.<name>"`` below. The ``ray`` scenario (``ray_actors``) starts its
own local Ray cluster in ``run`` and stops it before returning; ``ctx.redis_url`` is the run's
private Redis.
"""

#: Scenario name -> module, in run order.
SCENARIOS: dict[str, str] = {
    "relay": "stickless.bench.relay",
    "turns": "stickless.bench.turns",
    "sessions": "stickless.bench.sessions",
    "sustained": "stickless.bench.sustained",
    "idle": "stickless.bench.idle",
    "renewal": "stickless.bench.renewal",
    "contention": "stickless.bench.contention",
    "failover": "stickless.bench.failover",
    "history": "stickless.bench.history",
    "http": "stickless.bench.http",
    "ray": "stickless.bench.ray_actors",
}

__all__ = ["SCENARIOS"]
