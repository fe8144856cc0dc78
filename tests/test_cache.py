"""The live-handle cache: options on open, idle expiry, LRU bound, pinning while a turn runs."""

from __future__ import annotations

from .agents import Journal, req, wait_until
from .conftest import make_cluster


async def test_handle_opens_once_with_options_and_attributes(journal: Journal) -> None:
    async with make_cluster(journal, nodes=1) as cluster:
        node = cluster.nodes[0]
        first = req("s1", "a", options={"model": "m1"}, open_attributes={"tenant": "t1"})
        await (await node.submit(first)).result
        # Options and attributes of later submits are ignored: the handle is cached
        second = req("s1", "b", options={"model": "m2"}, open_attributes={"tenant": "t2"})
        await (await node.submit(second)).result
    assert journal.opened == [("s1", "bot", {"options": {"model": "m1"}, "tenant": "t1"})]


async def test_idle_session_is_closed_and_its_lease_released(journal: Journal) -> None:
    async with make_cluster(journal, idle_ttl=0.2) as cluster:
        a, b, _ = cluster.nodes
        await (await a.submit(req("s1", "x"))).result
        # When the session stays idle past idle_ttl
        await wait_until(lambda: journal.closed == ["s1"])

        async def lease_gone() -> bool:
            return await cluster.backends.leases.current("s1") is None

        # Then the handle is closed first and then the lease is returned (no broadcast needed)
        await wait_until(lease_gone)
        result = await (await b.submit(req("s1", "y"))).result
        assert result.executed_by == b.node_id


async def test_lru_bound_closes_least_recently_used_but_defers_a_running_one(
    journal: Journal,
) -> None:
    async with make_cluster(journal, nodes=1, max_cached_sessions=2) as cluster:
        node = cluster.nodes[0]
        gate = journal.gate("pinned")
        pinned = await node.submit(req("s1", "pinned"))
        await journal.entered["pinned"].wait()
        await (await node.submit(req("s2", "b"))).result
        # When a third session exceeds the bound while s1's turn runs (s1 is least recent)
        await (await node.submit(req("s3", "c"))).result
        # Then s1 is not closed mid-turn; it closes once its turn ends
        assert "s1" not in journal.closed
        gate.set()
        await pinned.result
        await wait_until(lambda: "s1" in journal.closed)
        assert sorted(node.local_sessions()) == ["s2", "s3"]
        # When a fourth arrives with nothing running, the least recently used (s2) goes
        await (await node.submit(req("s4", "d"))).result
        await wait_until(lambda: "s2" in journal.closed)
        assert sorted(node.local_sessions()) == ["s3", "s4"]
