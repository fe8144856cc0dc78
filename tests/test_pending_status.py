"""Pending backlog in status() and the node gauge: a collected message not yet answered shows on
its holder (read when asked), in the holder's STATUS signals (read on each heartbeat) and in the
gauge, and leaves all three once answered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from stickless import SessionRouter, SessionState, SubmitKind
from stickless._metrics import SafeMetrics
from stickless.testing import CountingMetrics
from stickless.wire import StatusPayload, pack, unpack

from .agents import Journal, req, wait_until
from .conftest import ClusterFactory

#: Hang guard only: the FAST heartbeat comes every half second.
GUARD = 10.0

Gauge = tuple[str, int, int, float | None]


class GaugeWatch(CountingMetrics):
    """Counting metrics whose pending gauge can be awaited."""

    def __init__(self) -> None:
        super().__init__()
        self._gauged = asyncio.Event()

    def on_pending_gauge(
        self, node_id: str, sessions: int, pending: int, oldest_idle: float | None
    ) -> None:
        super().on_pending_gauge(node_id, sessions, pending, oldest_idle)
        self._gauged.set()

    async def gauge(self, node_id: str, since: int, wanted: Callable[[Gauge], bool]) -> Gauge:
        """The first gauge of `node_id` recorded after call number `since` that is `wanted`."""
        while True:
            for hook, args in self.calls[since:]:
                if hook == "on_pending_gauge" and args[0] == node_id and wanted(args):
                    return (args[0], args[1], args[2], args[3])
            self._gauged.clear()
            await self._gauged.wait()


async def _peer_sees(peer: SessionRouter, pending: int, state: SessionState) -> bool:
    status = await peer.status("s1")
    return status.state is state and status.pending == pending


async def test_a_pending_message_shows_in_status_and_the_gauge_until_it_is_answered(
    cluster_over: ClusterFactory, journal: Journal
) -> None:
    metrics = GaugeWatch()
    async with cluster_over(nodes=2, metrics=metrics) as cluster:
        a, b = cluster.nodes
        await (await a.submit(req("s1", "first"))).result
        # Given a message forwarded to the holder, collected there and running on a gate
        gate = journal.gate("hold")
        mark = len(metrics.calls)
        held = await b.submit(req("s1", "hold"))
        assert held.kind is SubmitKind.FORWARDED
        await journal.entered["hold"].wait()
        # Then the holder's status counts it pending, with how long it has waited
        status = await a.status("s1")
        assert (status.state, status.pending) == (SessionState.RUNNING, 1)
        assert status.oldest_pending_idle is not None and status.oldest_pending_idle >= 0.0
        # And the holder's gauge has the totals over the sessions it holds
        node, sessions, pending, idle = await asyncio.wait_for(
            metrics.gauge(a.node_id, mark, lambda g: g[2] > 0), GUARD
        )
        assert (node, sessions, pending) == (a.node_id, 1, 1) and idle is not None
        # And the peer learns the numbers from the holder's heartbeat
        await wait_until(lambda: _peer_sees(b, 1, SessionState.RUNNING), GUARD)
        seen = await b.status("s1")
        assert seen.oldest_pending_idle is not None and seen.holder == a.node_id
        # When the turn is answered
        gate.set()
        assert (await held.result).text == "echo:hold"
        mark = len(metrics.calls)
        # Then nothing is pending on the holder, in its gauge, nor (once re-announced, though
        # the session is idle) in the peer's view
        after = await a.status("s1")
        assert (after.pending, after.oldest_pending_idle) == (0, None)
        assert await asyncio.wait_for(metrics.gauge(a.node_id, mark, lambda g: True), GUARD) == (
            a.node_id,
            1,
            0,
            None,
        )
        await wait_until(lambda: _peer_sees(b, 0, SessionState.IDLE), GUARD)


async def test_a_node_holding_nothing_reports_an_empty_gauge(
    cluster_over: ClusterFactory,
) -> None:
    metrics = GaugeWatch()
    async with cluster_over(nodes=1, metrics=metrics) as cluster:
        (a,) = cluster.nodes
        gauge = await asyncio.wait_for(metrics.gauge(a.node_id, 0, lambda g: True), GUARD)
        assert gauge == (a.node_id, 0, 0, None)


def test_status_signals_of_nodes_before_and_after_the_backlog_fields_read_each_other() -> None:
    # Given a STATUS payload as a node without the backlog fields sends it, and a new one
    old = {"holder": "n1", "token": 3, "state": "RUNNING", "queued": 0, "seq": 1, "updated_at": 1.0}
    new = StatusPayload(**old, pending=2, oldest_pending_idle=4.5).model_dump()
    # Then the old one reads as no backlog, and the new one round-trips as primitives (an older
    # reader ignores the extra keys)
    assert StatusPayload.model_validate(old).pending == 0
    assert StatusPayload.model_validate(old).oldest_pending_idle is None
    assert StatusPayload.model_validate(unpack(pack(new))).pending == 2
    assert (new["pending"], new["oldest_pending_idle"]) == (2, 4.5)


def test_metrics_written_before_a_hook_existed_skip_it_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Older:
        """Metrics that know only one hook (say, from before the gauge existed)."""

        def __init__(self) -> None:
            self.dropped: list[tuple[str, int]] = []

        def on_events_dropped(self, session_id: str, count: int) -> None:
            self.dropped.append((session_id, count))

    older = Older()
    safe = SafeMetrics(older)  # type: ignore[arg-type]
    # When a hook it lacks is emitted, then one it has
    with caplog.at_level(logging.WARNING, logger="stickless.metrics"):
        safe.emit("on_pending_gauge", "n1", 0, 0, None)
        safe.emit("on_events_dropped", "s1", 3)
    # Then the missing one is skipped without an error logged, and the known one still runs
    assert older.dropped == [("s1", 3)]
    assert caplog.records == []
