"""PrometheusMetrics on a private registry (every hook moves its metric), the metrics package
without its extras, and `on_turn_finished` / a failing exporter on a simulated cluster."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from typing import Any

import pytest

from stickless import FailureCode, TurnFailedError
from stickless.metrics import METRICS, PrometheusMetrics
from stickless.testing import CountingMetrics, LocalCluster

from .agents import Journal, ScriptedOpener, req
from .test_failures import QUICK

#: (hook, its arguments, the sample it moves (after "stickless_"), its labels, by how much).
HOOKS: list[tuple[str, tuple[Any, ...], str, dict[str, str], float]] = [
    ("on_submit", ("s1", "FORWARDED"), "submits_total", {"kind": "FORWARDED"}, 1),
    ("on_turn_finished", ("s1", "t1", "completed", 0.3), "turns_total", {"result": "completed"}, 1),
    ("on_turn_finished", ("s", "t", "FAILED", 2), "turn_duration_seconds_sum", {"result": "FAILED"}, 2),  # noqa: E501
    ("on_lock_acquire", ("s1", True, 0.002), "lease_acquire_seconds_count", {"won": "true"}, 1),
    ("on_lock_acquire", ("s1", False, 0.004), "lease_acquire_seconds_sum", {"won": "false"}, 0.004),
    ("on_pending_gauge", ("n1", 4, 7, 2.5), "sessions_held", {}, 4),
    ("on_pending_gauge", ("n1", 4, 7, 2.5), "pending_entries", {}, 7),
    ("on_pending_gauge", ("n1", 4, 7, 2.5), "oldest_pending_idle_seconds", {}, 2.5),
    ("on_cache_hit", ("s1",), "cache_hits_total", {}, 1),
    ("on_cache_miss", ("s1",), "cache_misses_total", {}, 1),
    ("on_evict", ("s1", "IDLE"), "evictions_total", {"reason": "IDLE"}, 1),
    ("on_lease_extend_failed", ("s1",), "lease_extend_failures_total", {}, 1),
    ("on_holder_loss", ("s1", "t1"), "holder_loss_total", {}, 1),
    ("on_takeover_rejected", ("s1", "k1"), "takeover_rejected_total", {}, 1),
    ("on_forward_doorbell_rerung", ("s1",), "forward_doorbell_rerung_total", {}, 1),
    ("on_events_dropped", ("s1", 5, "reasoning"), "events_dropped_total", {"rank": "reasoning"}, 5),
    ("on_events_dropped", ("s", 2, "subscriber"), "events_dropped_total", {"rank": "subscriber"}, 2),  # noqa: E501
    ("on_redelivered", ("s1", 3), "redelivered_total", {}, 3),
    ("on_reclaimed", ("s1", 2), "reclaimed_total", {}, 2),
    ("on_retried", ("s1", "t1", 2), "retries_total", {}, 1),
    ("on_dead_lettered", ("s1", "t1", "failed 3 attempt(s)"), "dead_letters_total", {}, 1),
    ("on_store_warnings", (1,), "store_warnings", {}, 1),
    ("on_loop_failure", ("n1", "holder_loss_sweep"), "loop_failures_total", {"loop": "holder_loss_sweep"}, 1),  # noqa: E501
]  # fmt: skip


def _sample(metrics: PrometheusMetrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(("hook", "args", "sample", "labels", "delta"), HOOKS)
def test_every_hook_moves_its_metric(
    hook: str, args: tuple[Any, ...], sample: str, labels: dict[str, str], delta: float
) -> None:
    metrics = PrometheusMetrics()
    before = _sample(metrics, f"stickless_{sample}", labels)
    # When the hook is called once
    getattr(metrics, hook)(*args)
    # Then its sample moved by exactly its amount
    assert _sample(metrics, f"stickless_{sample}", labels) - before == pytest.approx(delta)


def test_every_exported_metric_is_moved_by_some_hook() -> None:
    moved = {f"stickless_{s.removesuffix('_sum').removesuffix('_count')}" for *_, s, _, _ in HOOKS}
    assert moved == set(METRICS)


def test_every_hook_of_the_protocol_is_exported() -> None:
    from stickless import SessionMetrics

    hooks = {name for name in dir(SessionMetrics) if name.startswith("on_")}
    assert hooks == {hook for hook, *_ in HOOKS}
    assert hooks <= set(dir(PrometheusMetrics))


def test_no_pending_entry_reads_as_zero_idle() -> None:
    metrics = PrometheusMetrics()
    metrics.on_pending_gauge("n1", 1, 1, 9.0)
    metrics.on_pending_gauge("n1", 1, 0, None)
    assert _sample(metrics, "stickless_oldest_pending_idle_seconds", {}) == 0.0


def test_exporters_have_private_registries_and_text_exposition() -> None:
    first, second = PrometheusMetrics(), PrometheusMetrics()  # no duplicate registration
    first.on_turn_finished("s1", "t1", "completed", 0.1)
    body, content_type = first.exposition()
    assert content_type.startswith("text/plain")
    assert b'stickless_turns_total{result="completed"} 1.0' in body
    assert b'stickless_turns_total{result="completed"}' not in second.exposition()[0]


def test_stickless_imports_without_the_metrics_extras() -> None:
    # Given prometheus_client and ray cannot be imported, stickless and its metrics package still
    # import (the exporters load on first use, and only then need their extra)
    code = (
        "import sys; sys.modules['prometheus_client'] = None; sys.modules['ray'] = None\n"
        "import stickless, stickless.metrics\n"
        "from stickless.metrics import METRICS\n"
        "try:\n    stickless.metrics.PrometheusMetrics\nexcept ImportError:\n    print('lazy')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "lazy"


# ---------------------------------------------------------------- on a simulated cluster


def _finished(metrics: CountingMetrics) -> list[tuple[str, str]]:
    return [(args[1], args[2]) for hook, args in metrics.calls if hook == "on_turn_finished"]


async def test_each_turn_is_counted_once_with_its_result(journal: Journal) -> None:
    metrics = CountingMetrics()
    async with LocalCluster(2, opener=ScriptedOpener(journal), metrics=metrics) as cluster:
        a, b = cluster.nodes
        # Given three turns that complete (one forwarded to the holder) and one interrupted
        turns = [await a.submit(req("s1", "one")), await b.submit(req("s1", "two"))]
        turns.append(await a.submit(req("s1", "three")))
        for turn in turns:
            await turn.result
        journal.gate("stopped")
        stopped = await a.submit(req("s1", "stopped"))
        await journal.entered["stopped"].wait()
        assert await a.interrupt("s1")
        with pytest.raises(TurnFailedError):
            await stopped.result
    # Then each turn's end was reported once, with its result
    ids = [turn.turn_id for turn in turns]
    expected = [*((i, "completed") for i in ids), (stopped.turn_id, "INTERRUPTED")]
    assert sorted(_finished(metrics)) == sorted(expected)


async def test_a_holder_loss_counts_on_the_node_that_declares_it(journal: Journal) -> None:
    metrics = CountingMetrics()
    async with LocalCluster(2, opener=ScriptedOpener(journal), metrics=metrics, **QUICK) as cluster:
        a, b = cluster.nodes
        await (await a.submit(req("s1", "warm"))).result
        # Given a slow turn of a session A holds, submitted on B
        journal.gate("slow")
        slow = await b.submit(req("s1", "slow"))
        await journal.entered["slow"].wait()
        # When the holder dies mid-turn
        await cluster.kill(a)
        with pytest.raises(TurnFailedError) as failure:
            await asyncio.wait_for(slow.result, 10)
        assert failure.value.code is FailureCode.HOLDER_LOST
    # Then the survivor reported the turn's end as HOLDER_LOST, once, with the holder loss
    assert _finished(metrics)[1:] == [(slow.turn_id, "HOLDER_LOST")]
    assert metrics.counts["on_holder_loss"] == 1


async def test_a_raising_exporter_is_logged_once_and_turns_still_complete(
    journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(PrometheusMetrics):
        def on_turn_finished(self, *args: Any) -> None:
            raise RuntimeError("exporter down")

    metrics = Broken()
    with caplog.at_level(logging.ERROR, logger="stickless.metrics"):
        async with LocalCluster(1, opener=ScriptedOpener(journal), metrics=metrics) as cluster:
            node = cluster.nodes[0]
            # When three turns run while the exporter's turn hook raises
            results = [await (await node.submit(req("s1", f"t{i}"))).result for i in range(3)]
    # Then every turn completed, the other hooks still exported, and the failure was logged once
    assert [r.text for r in results] == ["echo:t0", "echo:t1", "echo:t2"]
    assert _sample(metrics, "stickless_submits_total", {"kind": "EXECUTED_LOCALLY"}) == 3
    failures = [r for r in caplog.records if "on_turn_finished" in r.getMessage()]
    assert len(failures) == 1


def test_the_grafana_dashboard_reads_only_exported_metrics() -> None:
    import json
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "grafana-dashboard.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {
        re.sub(r"_(bucket|sum|count)$", "", n)
        for e in exprs
        for n in re.findall(r"stickless_\w+", e)
    }
    # Every metric the dashboard reads is exported, and every exported one is on it
    assert names == set(METRICS)
