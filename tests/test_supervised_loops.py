"""Supervised background loops: a round that raises is logged with its traceback, counted, and
the loop runs again after a backoff; a loop failing round after round makes `/readyz` unready
until one of its rounds succeeds. Exceptions are injected into a real router's loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from stickless import MemoryBackends, RouterConfig, SessionRouter
from stickless.metrics import PrometheusMetrics
from stickless.router._loops import FAILING_AFTER, RESTART_CAP, LoopHealth, next_pause
from stickless.router._sweeps import Sweeps
from stickless.web import create_app

from .agents import Journal, ScriptedOpener, req

LOOP = "holder_loss_sweep"


@pytest.mark.parametrize(
    ("interval", "failures", "pause"),
    [
        (1.0, 0, 1.0),  # healthy: the loop's own interval
        (0.05, 1, 0.1),  # the first failure: the first backoff
        (0.05, 2, 0.2),  # doubling with each failure in a row
        (0.05, 4, 0.8),
        (0.05, 20, RESTART_CAP),  # up to the cap
        (30.0, 3, 30.0),  # an interval longer than the backoff wins
    ],
)
def test_the_pause_after_failed_rounds(interval: float, failures: int, pause: float) -> None:
    assert next_pause(interval, failures) == pytest.approx(pause)


def test_a_loop_counts_as_failing_after_rounds_in_a_row_until_one_succeeds() -> None:
    health = LoopHealth()
    for n in range(1, FAILING_AFTER):
        assert health.failed("poll", RuntimeError("boom")) == n
        assert health.failing == {}
    assert health.failed("poll", RuntimeError("boom")) == FAILING_AFTER
    assert health.failing == {
        "poll": f"{FAILING_AFTER} rounds failed in a row, the last with RuntimeError: boom"
    }
    health.succeeded("poll")
    assert health.failing == {}
    assert health.failed("poll", RuntimeError("again")) == 1  # counted afresh
    health.stopped("sweep", KeyboardInterrupt("stop"))
    assert health.failing == {"sweep": "stopped with KeyboardInterrupt: stop"}


class Served:
    """A started router over memory with a Prometheus exporter, and an HTTP client of its
    gateway (for `/readyz`)."""

    def __init__(self, router: SessionRouter, metrics: PrometheusMetrics) -> None:
        self.router = router
        self.metrics = metrics
        app = create_app(router)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway"
        )

    def failures(self) -> float:
        sample = "stickless_loop_failures_total"
        return self.metrics.registry.get_sample_value(sample, {"loop": LOOP}) or 0.0


@pytest.fixture
async def served(journal: Journal) -> AsyncIterator[Served]:
    metrics = PrometheusMetrics()
    router = SessionRouter.build(
        config=RouterConfig(node_id="n1", holder_loss_sweep_interval=0.05),
        opener=ScriptedOpener(journal),
        backends=MemoryBackends(),
        metrics=metrics,
    )
    await router.start()
    running = Served(router, metrics)
    yield running
    await running.client.aclose()
    await router.aclose(grace=1.0)


Sweep = Callable[[Sweeps], Awaitable[None]]


def inject(monkeypatch: pytest.MonkeyPatch, fails: Callable[[int], bool]) -> list[asyncio.Event]:
    """Make the holder-loss sweep raise on the rounds `fails(n)` picks (n counts from 1), and
    run the real sweep on the others; the returned events are set as rounds 1, 2, ... start."""
    real: Sweep = Sweeps.sweep_holder_loss
    started = [asyncio.Event() for _ in range(64)]
    calls = 0

    async def sweep(self: Sweeps) -> None:
        nonlocal calls
        calls += 1
        started[min(calls, len(started)) - 1].set()
        if fails(calls):
            raise RuntimeError(f"injected failure of round {calls}")
        await real(self)

    monkeypatch.setattr(Sweeps, "sweep_holder_loss", sweep)
    return started


async def test_a_loop_that_raises_is_logged_counted_and_runs_again(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="stickless.router")
    # Given the holder-loss sweep raises once, unexpectedly
    started = inject(monkeypatch, lambda n: n == 1)
    # When its loop goes on: the real sweep runs in the next rounds
    await started[2].wait()
    # Then the failure was logged with its traceback and counted once
    failed = [r for r in caplog.records if f"background loop {LOOP} failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert failed[0].exc_info[0] is RuntimeError
    assert "injected failure of round 1" in caplog.text and "Traceback" in caplog.text
    assert served.failures() == 1
    # And one failure does not make the node unready; its turns run
    assert (await served.client.get("/readyz")).status_code == 200
    assert (await (await served.router.submit(req("s1", "hi"))).result).text == "echo:hi"


async def test_a_loop_failing_round_after_round_makes_the_node_unready_until_it_recovers(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    healed = False
    # Given the holder-loss sweep raises on every round
    started = inject(monkeypatch, lambda n: not healed)
    # When it has failed FAILING_AFTER rounds in a row (the next round has started)
    await started[FAILING_AFTER].wait()
    # Then /readyz says the node is unready, naming the loop and its error
    unready = await served.client.get("/readyz")
    assert unready.status_code == 503 and unready.headers["retry-after"] == "1"
    error: dict[str, Any] = unready.json()["error"]
    assert error["code"] == "LOOP_FAILING"
    assert LOOP in error["message"] and "RuntimeError: injected failure" in error["message"]
    assert LOOP in served.router.failing_loops
    assert served.failures() >= FAILING_AFTER
    # When the loop's rounds succeed again
    healed = True
    rounds = sum(event.is_set() for event in started)
    await started[rounds + 1].wait()  # (a round ran through after the healed one started)
    # Then the node is ready again
    assert served.router.failing_loops == {}
    assert (await served.client.get("/readyz")).status_code == 200
