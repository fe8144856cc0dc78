"""The collect before a local turn is skipped when the turn's reserve saw nothing waiting in the
session's inbox (one store call less per local turn), and made when something did."""

from __future__ import annotations

from typing import Any

import pytest

from stickless import Priority, UserInput
from stickless.wire import Envelope

from .agents import Journal, req, wait_until
from .conftest import make_cluster


def _counting_collects(backends: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The session ids of every collect the node makes from now on."""
    calls: list[str] = []
    collect, take = backends.inbox.collect, backends.hotpath.take

    async def counted(session_id: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(session_id)
        return await collect(session_id, *args, **kwargs)

    async def counted_take(session_id: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(session_id)  # (a collect that takes a lone message over with it)
        return await take(session_id, *args, **kwargs)

    monkeypatch.setattr(backends.inbox, "collect", counted)
    monkeypatch.setattr(backends.hotpath, "take", counted_take)
    return calls


async def test_a_local_turn_with_nothing_waiting_is_not_preceded_by_a_collect(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_cluster(journal, nodes=1) as cluster:
        node = cluster.nodes[0]
        await (await node.submit(req("s1", "warm"))).result
        collects = _counting_collects(node.backends, monkeypatch)
        # When the session's holder runs two more turns with nothing in the inbox
        for text in ("one", "two"):
            await (await node.submit(req("s1", text))).result
        # Then no collect went before them
        assert collects == []
        assert journal.texts("s1") == ["warm", "one", "two"]


async def test_a_local_turn_behind_a_waiting_message_collects_it_first(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_cluster(journal, nodes=1) as cluster:
        node = cluster.nodes[0]
        await (await node.submit(req("s1", "warm"))).result
        collects = _counting_collects(node.backends, monkeypatch)
        # Given a message waiting in the inbox whose doorbell never rang (a missed doorbell)
        waiting = Envelope(
            session_id="s1",
            turn_id="t-waiting",
            agent_ref="bot",
            input=UserInput.text("waiting"),
            key="t:t-waiting",
            priority=Priority.LATER,
        )
        idem = node.backends.idempotency
        reserved = await idem.put_if_absent(
            "s1", waiting.key, "t-waiting", "h", node.node_id, 30.0, 600.0
        )
        assert reserved is None
        assert await idem.release_holder("s1", waiting.key, node.node_id, 30.0)
        await node.backends.inbox.deliver(waiting)
        # When the holder runs a local turn
        await (await node.submit(req("s1", "local"))).result
        # Then it collected before the turn, so the waiting message runs (after it: a collected
        # message queues behind the turns already in the mailbox)
        assert collects and collects[0] == "s1"
        await wait_until(lambda: journal.texts("s1") == ["warm", "local", "waiting"])
